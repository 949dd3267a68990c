// ZeRO's stages as settings of the flat-parameter machinery FSDP uses.
#include "shardtrain/zero.h"

#include <stdexcept>

namespace shardtrain {

std::unique_ptr<FullyShardedDataParallel> zero_shard(Transformer model, const DeviceMesh& mesh,
                                                     ZeroOptions options) {
  if (options.stage_ < 1 || options.stage_ > 3) {
    throw std::invalid_argument("ZeRO stage must be 1, 2 or 3, got " +
                                std::to_string(options.stage_));
  }
  if (options.offload_param_ != OffloadDevice::kNone && options.stage_ != 3) {
    throw std::invalid_argument(
        "ZeRO offload_param needs stage 3 (stages 1 and 2 keep whole "
        "parameters on every rank)");
  }
  for (const auto& [what, device] : {std::pair{"offload_optimizer", options.offload_optimizer_},
                                     std::pair{"offload_param", options.offload_param_}}) {
    if (device == OffloadDevice::kNvme && options.nvme_path_.empty()) {
      throw std::invalid_argument(std::string("ZeRO ") + what + " = nvme needs nvme_path");
    }
  }
  ZeroBehaviour behaviour = options.behaviour_;
  behaviour.stage = options.stage_;
  FSDPOptions fsdp;
  fsdp.wrap(options.wrap_)
      .mixed_precision(options.mixed_precision_)
      .cpu_offload(options.offload_param_ != OffloadDevice::kNone)
      .param_swap_dir(options.offload_param_ == OffloadDevice::kNvme ? options.nvme_path_ : "")
      .grad_swap_dir(options.offload_optimizer_ == OffloadDevice::kNvme && options.stage_ >= 2
                         ? options.nvme_path_
                         : "")
      .zero(behaviour);
  if (options.stage_ == 3) {
    // Prefetching is bounded by DeepSpeed's element counts instead of a unit count.
    fsdp.forward_prefetch(behaviour.prefetch_bucket_size > 0)
        .backward_prefetch(behaviour.prefetch_bucket_size > 0 ? BackwardPrefetch::kBackwardPre
                                                              : BackwardPrefetch::kNone);
  }
  return std::make_unique<FullyShardedDataParallel>(std::move(model), mesh, std::move(fsdp));
}

}  // namespace shardtrain
