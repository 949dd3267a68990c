// The trainer's replicated step: DistributedDataParallel with the parallel.ddp.* settings as its
// options, or the model alone under "none".
#include "parallel/ddp/replicated_model.h"
#include "parallel/expert/expert_parallel.h"
#include "parallel/parallelize.h"

namespace shardtrain {

std::optional<DDPOptions> ddp_options(const TrainConfig& config) {
  if (config.parallel.strategy != ParallelStrategy::kDdp) return std::nullopt;
  return DDPOptions()
      .bucket_cap_mb(config.parallel.ddp.bucket_cap_mb)
      // A block progressive layer dropping skipped gets no gradient: zeros in the all-reduce.
      .find_unused_parameters(config.parallel.ddp.find_unused_parameters ||
                              config.train.layer_drop != "none")
      .comm_hook(config.parallel.ddp.comm_hook);
}

std::unique_ptr<ParallelModel> apply_ddp(Transformer& model, std::optional<DDPOptions> ddp,
                                         const std::shared_ptr<ProcessGroup>& world,
                                         const DeviceMesh* mesh) {
  // Every rank holds the whole model (its experts, under expert parallelism): DDP's replicas
  // start from identical values.
  model->materialize();
  // Plain DDP keeps the world as its group; under tp or pp it runs on the mesh's dp axis.
  const int pp = mesh ? mesh->size(MeshAxis::kPp) : 1;
  const bool meshed = mesh && (mesh->size(MeshAxis::kTp) > 1 || pp > 1);
  const auto dp = !world ? nullptr : meshed ? mesh->dp_ptr() : world;
  // Under expert parallelism the experts' gradients are averaged over the ranks that hold the
  // same experts (the expert mesh's dp group), everything else's over every data-parallel rank.
  const bool experts_apart = mesh && mesh->ep_size() > 1;
  std::vector<std::string> expert_names, dense_names;
  for (const auto& item : model->named_parameters()) {
    (experts_apart && detail::is_expert_tensor(item.key()) ? expert_names : dense_names)
        .push_back(item.key());
  }
  std::unique_ptr<DistributedDataParallel> wrapper, expert_wrapper;
  if (ddp && dp && dp->size() > 1) {
    wrapper = std::make_unique<DistributedDataParallel>(model.ptr(), dp,
                                                        DDPOptions(*ddp).ignore(expert_names));
  }
  Holders dense;
  dense.dp_size = mesh ? mesh->dp().size() : 1;
  dense.dp_rank = mesh ? mesh->dp().rank() : 0;
  // A checkpoint's tensors are shared out among the ranks holding this model: the world, or
  // this pipeline stage's ranks (the mesh's pp axis is its outermost).
  dense.size = world ? world->size() / pp : 1;
  dense.rank = world ? world->rank() % dense.size : 0;
  Holders experts = dense;
  if (experts_apart) {
    const DeviceMesh& holding = mesh->expert_mesh();
    if (ddp && holding.dp().size() > 1) {
      expert_wrapper = std::make_unique<DistributedDataParallel>(
          model.ptr(), holding.dp_ptr(), DDPOptions(*ddp).ignore(dense_names));
    }
    experts.dp_size = holding.dp().size();
    experts.dp_rank = holding.dp().rank();
    experts.size = holding.world().size() / pp;
    experts.rank = holding.world().rank() % experts.size;
  }
  const std::string description =
      dense.dp_size > 1 ? "data parallel (ddp) over " + std::to_string(dense.dp_size) + " ranks\n"
                        : "";
  return std::make_unique<ReplicatedModel>(model, world, std::move(wrapper), dense,
                                           std::move(expert_wrapper), experts, description);
}

}  // namespace shardtrain
