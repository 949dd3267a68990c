// The trainer's DDP step: parallel.ddp.* settings onto DistributedDataParallel.
#include "parallel/parallelize.h"

namespace shardtrain {

std::unique_ptr<DistributedDataParallel> apply_ddp(Transformer& model, const TrainConfig& config,
                                                   const std::shared_ptr<ProcessGroup>& dp) {
  // Every rank holds the whole model: DDP's replicas start from identical values.
  model->materialize();
  const DDPCommHook hook = config.ddp_comm_hook == "bf16"   ? DDPCommHook::kBf16Compress
                           : config.ddp_comm_hook == "fp16" ? DDPCommHook::kFp16Compress
                                                            : DDPCommHook::kNone;
  return std::make_unique<DistributedDataParallel>(
      model.ptr(), dp,
      DDPOptions()
          .bucket_cap_mb(config.ddp_bucket_cap_mb)
          .find_unused_parameters(config.ddp_find_unused_parameters)
          .comm_hook(hook));
}

}  // namespace shardtrain
