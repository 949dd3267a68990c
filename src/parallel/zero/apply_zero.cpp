// The trainer's ZeRO step: zero_shard, and the parallel.zero.* and precision.* settings as its
// options.
#include "parallel/parallelize.h"
#include "parallel/zero/nvme_sharded_model.h"
#include "shardtrain/zero.h"

namespace shardtrain {

ZeroOptions zero_options(const TrainConfig& config) {
  ZeroBehaviour knobs;
  knobs.overlap_comm = config.parallel.zero.overlap_comm;
  knobs.reduce_bucket_size = config.parallel.zero.reduce_bucket_size;
  knobs.allgather_bucket_size = config.parallel.zero.allgather_bucket_size;
  knobs.prefetch_bucket_size = config.parallel.zero.prefetch_bucket_size;
  knobs.persistence_threshold = config.parallel.zero.param_persistence_threshold;
  knobs.max_live_parameters = config.parallel.zero.max_live_parameters;
  return ZeroOptions()
      .stage(static_cast<int>(config.parallel.zero.stage))
      .offload_optimizer(config.parallel.zero.offload_optimizer)
      .offload_param(config.parallel.zero.offload_param)
      .nvme_path(config.parallel.zero.nvme_path)
      .behaviour(knobs)
      .mixed_precision(mixed_precision_of(config));
}

std::unique_ptr<ParallelModel> apply_zero(Transformer& model, ZeroOptions options,
                                          const std::shared_ptr<ProcessGroup>& world,
                                          const DeviceMesh& mesh) {
  const ZeroOptions settings = options;
  auto sharded = zero_shard(model, mesh, std::move(options));
  const std::string description = "zero stage " + std::to_string(settings.stage_) + " over " +
                                  std::to_string(mesh.dp().size()) + " rank(s), " +
                                  std::to_string(sharded->unit_layout().size()) +
                                  " units, optimizer offload " +
                                  to_string(settings.offload_optimizer_) + ", parameter offload " +
                                  to_string(settings.offload_param_) + "\n";
  if (settings.offload_optimizer_ == OffloadDevice::kNvme) {
    // The moments of each unit's shard live in files; the trainer's AdamW then holds no state.
    return std::make_unique<NvmeShardedModel>(model, world, std::move(sharded), &mesh.dp(),
                                              settings.nvme_path_, description);
  }
  return std::make_unique<ShardedModel>(model, world, std::move(sharded), &mesh.dp(), description);
}

}  // namespace shardtrain
