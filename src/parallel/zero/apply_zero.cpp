// The trainer's ZeRO step: zero_shard, and the parallel.zero.* and precision.* settings as its
// options.
#include "parallel/parallelize.h"
#include "parallel/zero/nvme_sharded_model.h"
#include "shardtrain/zero.h"

namespace shardtrain {

ZeroOptions zero_options(const TrainConfig& config) {
  ZeroBehaviour knobs;
  knobs.overlap_comm = config.zero_overlap_comm;
  knobs.reduce_bucket_size = config.zero_reduce_bucket_size;
  knobs.allgather_bucket_size = config.zero_allgather_bucket_size;
  knobs.prefetch_bucket_size = config.zero_prefetch_bucket_size;
  knobs.persistence_threshold = config.zero_param_persistence_threshold;
  knobs.max_live_parameters = config.zero_max_live_parameters;
  return ZeroOptions()
      .stage(static_cast<int>(config.zero_stage))
      .offload_optimizer(offload_device_from_string(config.zero_offload_optimizer))
      .offload_param(offload_device_from_string(config.zero_offload_param))
      .nvme_path(config.zero_nvme_path)
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
