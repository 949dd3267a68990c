// ZeRO's optimizer step with its moments in files, and their way back into the files after a
// checkpoint is loaded (saving streams them: Trainer::streamed_slices).
#include "shardtrain/train.h"
#include "train/run_setup.h"

namespace shardtrain {

void Trainer::nvme_step(double lr) {
  torch::NoGradGuard no_grad;
  ++nvme_steps_;
  const AdamWStep hyper = AdamWStep()
                              .lr(lr)
                              .betas(config_.beta1, config_.beta2)
                              .eps(config_.eps)
                              .weight_decay(0.0)
                              .step(nvme_steps_);
  const auto shards = fsdp_->flat_shards();
  for (size_t u = 0; u < shards.size(); ++u) {
    const int unit = static_cast<int>(u);
    // With the parameter shards in files too, one unit's shard is in memory at a time.
    fsdp_->load_shards(unit);
    fsdp_->prefetch_shards(unit + 1);  // read while this unit steps
    // AdamW's decoupled decay comes first and is elementwise, so applying it per piece and
    // then stepping the whole shard with no decay is the same update.
    if (config_.weight_decay != 0.0) {
      for (const auto& s : fsdp_->segments()) {
        if (s.unit == unit && s.shape.size() >= 2) s.param.mul_(1.0 - lr * config_.weight_decay);
      }
    }
    nvme_[u]->step(shards[u].first, shards[u].second, hyper);
    fsdp_->store_shards(unit);
  }
}

void Trainer::restore_streamed(const ShardedCheckpointReader& reader) {
  const auto shards = fsdp_->flat_shards();
  for (size_t u = 0; u < shards.size(); ++u) {
    const int unit = static_cast<int>(u);
    fsdp_->load_shards(unit, /*gradients=*/false);
    fsdp_->prefetch_shards(unit + 1);
    // A checkpoint without optimizer state starts the moments from zeros, as a fresh run does.
    at::Tensor avg = at::zeros_like(shards[u].first);
    at::Tensor avg_sq = at::zeros_like(avg);
    for (const auto& s : fsdp_->segments()) {
      if (s.unit != unit) continue;
      reader.read_flat_into(s.name, s.offset, s.param.detach());
      const std::string prefix = "optim." + s.name;
      if (!reader.find(prefix + ".exp_avg")) continue;
      const int64_t numel = s.param.numel();
      reader.read_flat_into(prefix + ".exp_avg", s.offset, avg.narrow(0, s.shard_offset, numel));
      reader.read_flat_into(prefix + ".exp_avg_sq", s.offset,
                            avg_sq.narrow(0, s.shard_offset, numel));
      nvme_steps_ = reader.read(prefix + ".step").item<int64_t>();
    }
    nvme_[u]->load(avg, avg_sq);
    fsdp_->store_shards(unit);
  }
}

}  // namespace shardtrain
