// The trainer's FSDP step: flat_shard, and the parallel.fsdp.* and precision.* settings as its
// options.
#include "parallel/fsdp/sharded_model.h"
#include "parallel/parallelize.h"

namespace shardtrain {

FSDPOptions fsdp_options(const TrainConfig& config) {
  const WrapPolicy wrap = config.parallel.fsdp.wrap == FsdpWrap::kSize
                              ? WrapPolicy::size(config.parallel.fsdp.min_params)
                          : config.parallel.fsdp.wrap == FsdpWrap::kClass
                              ? WrapPolicy::class_name(config.parallel.fsdp.wrap_classes)
                              : WrapPolicy::blocks();
  return FSDPOptions()
      .sharding(config.parallel.fsdp.sharding)
      .wrap(wrap)
      .backward_prefetch(config.parallel.fsdp.prefetch)
      .forward_prefetch(config.parallel.fsdp.forward_prefetch)
      .limit_all_gathers(static_cast<int>(config.parallel.fsdp.limit_all_gathers))
      .cpu_offload(config.parallel.fsdp.cpu_offload)
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
