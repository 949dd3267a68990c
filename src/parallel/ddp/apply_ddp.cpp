// The trainer's replicated step: DistributedDataParallel with the parallel.ddp.* settings as its
// options, or the model alone under "none".
#include "parallel/ddp/replicated_model.h"
#include "parallel/parallelize.h"

namespace shardtrain {

std::optional<DDPOptions> ddp_options(const TrainConfig& config) {
  if (config.parallel.strategy != ParallelStrategy::kDdp) return std::nullopt;
  return DDPOptions()
      .bucket_cap_mb(config.parallel.ddp.bucket_cap_mb)
      .find_unused_parameters(config.parallel.ddp.find_unused_parameters)
      .comm_hook(config.parallel.ddp.comm_hook);
}

std::unique_ptr<ParallelModel> apply_ddp(Transformer& model, std::optional<DDPOptions> ddp,
                                         const std::shared_ptr<ProcessGroup>& world,
                                         const DeviceMesh* mesh) {
  // Every rank holds the whole model: DDP's replicas start from identical values.
  model->materialize();
  // Plain DDP keeps the world as its group; under tp or pp it runs on the mesh's dp axis.
  const int pp = mesh ? mesh->size(MeshAxis::kPp) : 1;
  const bool meshed = mesh && (mesh->size(MeshAxis::kTp) > 1 || pp > 1);
  const auto dp = !world ? nullptr : meshed ? mesh->dp_ptr() : world;
  std::unique_ptr<DistributedDataParallel> wrapper;
  if (ddp && dp && dp->size() > 1) {
    wrapper = std::make_unique<DistributedDataParallel>(model.ptr(), dp, std::move(*ddp));
  }
  const int dp_size = mesh ? mesh->dp().size() : 1;
  const int dp_rank = mesh ? mesh->dp().rank() : 0;
  // A checkpoint's tensors are shared out among the ranks holding this model: the world, or
  // this pipeline stage's ranks (the mesh's pp axis is its outermost).
  const int holders = world ? world->size() / pp : 1;
  const int holder_rank = world ? world->rank() % holders : 0;
  const std::string description =
      dp_size > 1 ? "data parallel (ddp) over " + std::to_string(dp_size) + " ranks\n" : "";
  return std::make_unique<ReplicatedModel>(model, world, std::move(wrapper), holder_rank, holders,
                                           dp_rank, dp_size, description);
}

}  // namespace shardtrain
