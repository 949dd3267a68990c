// What each ZeRO stage means for the flat-parameter machinery FSDP and ZeRO share
// (FullyShardedDataParallel asks ZeroBehaviour; stage 0 is FSDP itself).
#include <stdexcept>
#include <string>

#include "shardtrain/fsdp.h"

namespace shardtrain {

ShardingStrategy ZeroBehaviour::sharding(ShardingStrategy fsdp) const {
  if (stage < 0 || stage > 3) {
    throw std::invalid_argument("ZeRO stage must be 1, 2 or 3, got " + std::to_string(stage));
  }
  if (stage == 1 || stage == 2) return ShardingStrategy::kShardGradOp;
  if (stage == 3) return ShardingStrategy::kFullShard;
  return fsdp;
}

bool ZeroBehaviour::keeps_gathered(int64_t numel) const {
  return stage == 1 || stage == 2 || (stage == 3 && numel < persistence_threshold);
}

void ZeroBehaviour::check_frozen(bool any_frozen) const {
  if (!any_frozen || stage == 0) return;
  throw std::invalid_argument(
      "ZeRO stage " + std::to_string(stage) +
      " keeps optimizer state for every parameter; "
      "the model has frozen parameters (requires_grad false, e.g. a LoRA base): shard it with "
      "FSDP (shard_grad_op is ZeRO-2's layout, full_shard ZeRO-3's)");
}

void ZeroBehaviour::check_gradients_in_files() const {
  if (!whole_gradients()) return;
  throw std::invalid_argument(
      "FSDP: gradient shards in files (grad_swap_dir) need ZeRO "
      "stage 2 or 3 or FSDP; stage 1 keeps whole gradients");
}

}  // namespace shardtrain
