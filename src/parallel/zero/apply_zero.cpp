// The trainer's ZeRO step: parallel.zero.* and precision.* settings onto zero_shard.
#include "parallel/parallelize.h"
#include "shardtrain/zero.h"

namespace shardtrain {

void apply_zero(Transformer& model, const TrainConfig& config, const DeviceMesh& mesh,
                Parallelized& out) {
  ZeroBehaviour knobs;
  knobs.overlap_comm = config.zero_overlap_comm;
  knobs.reduce_bucket_size = config.zero_reduce_bucket_size;
  knobs.allgather_bucket_size = config.zero_allgather_bucket_size;
  knobs.prefetch_bucket_size = config.zero_prefetch_bucket_size;
  knobs.persistence_threshold = config.zero_param_persistence_threshold;
  knobs.max_live_parameters = config.zero_max_live_parameters;
  out.sharded =
      zero_shard(model, mesh,
                 ZeroOptions()
                     .stage(static_cast<int>(config.zero_stage))
                     .offload_optimizer(offload_device_from_string(config.zero_offload_optimizer))
                     .offload_param(offload_device_from_string(config.zero_offload_param))
                     .nvme_path(config.zero_nvme_path)
                     .behaviour(knobs)
                     .mixed_precision(mixed_precision_of(config)));
}

}  // namespace shardtrain
