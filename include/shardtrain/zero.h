// DeepSpeed-style ZeRO stages 1, 2 and 3 over FSDP's flat parameters (include/shardtrain/fsdp.h).
#pragma once

#include <memory>
#include <string>

#include "shardtrain/fsdp.h"

namespace shardtrain {

struct ZeroOptions {
  // 1: optimizer state sharded, gradients all-reduced, updated parameters all-gathered.
  // 2: + gradients reduce-scattered during backward, each rank keeping its partition.
  // 3: + parameters sharded and gathered per unit (FSDP's full_shard).
  ZeroOptions& stage(int value) {
    stage_ = value;
    return *this;
  }
  // kCpu: optimizer state and step in host memory (on a CPU-only machine that is where they
  // are); kNvme: optimizer state in files under nvme_path, streamed through the step, and at
  // stages 2 and 3 the gradient shards in files there too between backward and the step
  // (FSDPOptions::grad_swap_dir), as DeepSpeed swaps them with the optimizer state.
  ZeroOptions& offload_optimizer(OffloadDevice value) {
    offload_optimizer_ = value;
    return *this;
  }
  // Stage 3: parameter shards in host memory (kCpu) or in files under nvme_path (kNvme), read
  // for each gather (FSDPOptions::param_swap_dir). With kNvme the optimizer step and
  // checkpoints go between load_shards() and store_shards() (after_optimizer_step stores).
  ZeroOptions& offload_param(OffloadDevice value) {
    offload_param_ = value;
    return *this;
  }
  ZeroOptions& nvme_path(std::string value) {
    nvme_path_ = std::move(value);
    return *this;
  }
  ZeroOptions& behaviour(ZeroBehaviour value) {
    behaviour_ = value;
    return *this;
  }
  ZeroOptions& wrap(WrapPolicy value) {
    wrap_ = std::move(value);
    return *this;
  }
  ZeroOptions& mixed_precision(MixedPrecision value) {
    mixed_precision_ = value;
    return *this;
  }

  int stage_ = 1;
  OffloadDevice offload_optimizer_ = OffloadDevice::kNone;
  OffloadDevice offload_param_ = OffloadDevice::kNone;
  std::string nvme_path_;
  ZeroBehaviour behaviour_;
  WrapPolicy wrap_ = WrapPolicy::blocks();
  MixedPrecision mixed_precision_;
};

// Collective over the mesh's data-parallel ranks (dp_replicate must be 1). The returned object
// is used exactly as FSDP is: the optimizer takes segments(), each step calls zero_grad, backward,
// clip_grad_norm, the optimizer, after_optimizer_step. Throws std::invalid_argument for a stage
// outside 1-3, offload_param without stage 3, or nvme offload without nvme_path.
std::unique_ptr<FullyShardedDataParallel> zero_shard(Transformer model, const DeviceMesh& mesh,
                                                     ZeroOptions options = {});

}  // namespace shardtrain
