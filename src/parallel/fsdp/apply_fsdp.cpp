// The trainer's FSDP step: flat_shard, and the parallel.fsdp.* and precision.* settings as its
// options.
#include "parallel/fsdp/sharded_model.h"
#include "parallel/parallelize.h"

namespace shardtrain {

FSDPOptions fsdp_options(const TrainConfig& config) {
  const WrapPolicy wrap = config.fsdp_wrap == "size" ? WrapPolicy::size(config.fsdp_min_params)
                          : config.fsdp_wrap == "class"
                              ? WrapPolicy::class_name(config.fsdp_wrap_classes)
                              : WrapPolicy::blocks();
  return FSDPOptions()
      .sharding(sharding_strategy_from_string(config.fsdp_sharding))
      .wrap(wrap)
      .backward_prefetch(backward_prefetch_from_string(config.fsdp_prefetch))
      .forward_prefetch(config.fsdp_forward_prefetch)
      .limit_all_gathers(static_cast<int>(config.fsdp_limit_all_gathers))
      .cpu_offload(config.fsdp_cpu_offload)
      .mixed_precision(mixed_precision_of(config));
}

std::unique_ptr<ParallelModel> apply_fsdp(Transformer& model, FSDPOptions options,
                                          const std::shared_ptr<ProcessGroup>& world,
                                          const DeviceMesh& mesh) {
  const std::string sharding = to_string(options.sharding_);
  auto fsdp = flat_shard(model, mesh, std::move(options));
  const int replicas = mesh.shape().degree(MeshAxis::kDpReplicate);
  const std::string groups = replicas > 1
                                 ? " (" + std::to_string(replicas) + " replicas of " +
                                       std::to_string(mesh.shape().degree(MeshAxis::kDpShard)) +
                                       "-rank shard groups)"
                                 : "";
  const std::string description = "fsdp " + sharding + " over " + std::to_string(mesh.dp().size()) +
                                  " rank(s)" + groups + ", " +
                                  std::to_string(fsdp->unit_layout().size()) + " units\n";
  return std::make_unique<ShardedModel>(model, world, std::move(fsdp), &mesh.dp(), description);
}

}  // namespace shardtrain
