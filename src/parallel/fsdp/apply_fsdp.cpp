// The trainer's FSDP step: parallel.fsdp.* and precision.* settings onto fully_shard.
#include "parallel/parallelize.h"

namespace shardtrain {

void apply_fsdp(Transformer& model, const TrainConfig& config, const DeviceMesh& mesh,
                Parallelized& out) {
  const auto sharding = sharding_strategy_from_string(config.fsdp_sharding);
  const WrapPolicy wrap = config.fsdp_wrap == "size" ? WrapPolicy::size(config.fsdp_min_params)
                          : config.fsdp_wrap == "class"
                              ? WrapPolicy::class_name(config.fsdp_wrap_classes)
                              : WrapPolicy::blocks();
  out.sharded =
      flat_shard(model, mesh,
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
