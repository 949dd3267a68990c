// The trainer's FSDP step: parallel.fsdp.* and precision.* settings onto fully_shard.
#include <cstdlib>

#include "parallel/parallelize.h"

namespace shardtrain {

void apply_fsdp(Transformer& model, const TrainConfig& config,
                const std::shared_ptr<ProcessGroup>& world, Parallelized& out) {
  const int world_size = world->size();
  const auto sharding = sharding_strategy_from_string(config.fsdp_sharding);
  int replicate = 1;
  if (sharding == ShardingStrategy::kHybridShard) {
    replicate = static_cast<int>(config.fsdp_replicate);
    if (replicate == 0) {
      // One replica per node, sharding inside it, as PyTorch's hybrid_shard does.
      const char* local = std::getenv("LOCAL_WORLD_SIZE");
      const int per_node = local ? std::atoi(local) : 0;
      if (per_node <= 0 || world_size % per_node != 0 || world_size == per_node) {
        throw std::invalid_argument(
            "parallel.fsdp.sharding = \"hybrid_shard\" needs parallel.fsdp.replicate (the "
            "dp_replicate size) when the ranks are not on several nodes");
      }
      replicate = world_size / per_node;
    }
  }
  out.mesh = std::make_unique<DeviceMesh>(
      world, resolve_mesh(MeshShape().dp_replicate(replicate), world_size));
  const WrapPolicy wrap = config.fsdp_wrap == "size" ? WrapPolicy::size(config.fsdp_min_params)
                          : config.fsdp_wrap == "class"
                              ? WrapPolicy::class_name(config.fsdp_wrap_classes)
                              : WrapPolicy::blocks();
  out.sharded = fully_shard(
      model, *out.mesh,
      FSDPOptions()
          .sharding(sharding)
          .wrap(wrap)
          .backward_prefetch(backward_prefetch_from_string(config.fsdp_prefetch))
          .forward_prefetch(config.fsdp_forward_prefetch)
          .limit_all_gathers(static_cast<int>(config.fsdp_limit_all_gathers))
          .cpu_offload(config.fsdp_cpu_offload)
          .mixed_precision(mixed_precision_of(config)));
}

}  // namespace shardtrain
