#include "train/training_device.h"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/cuda.h>

#include <stdexcept>

#include "shardtrain/rendezvous.h"

namespace shardtrain::detail {

at::Device cuda_device_of_this_rank() {
  if (!torch::cuda::is_available()) {
#ifdef SHARDTRAIN_WITH_NCCL
    throw std::invalid_argument(
        "run.device = \"cuda\": no CUDA device is visible to this process (see nvidia-smi and "
        "CUDA_VISIBLE_DEVICES)");
#else
    throw std::invalid_argument(
        "run.device = \"cuda\": this shardtrain was built against a LibTorch without CUDA "
        "(build it against a CUDA LibTorch: docs/gpu.md)");
#endif
  }
  const auto count = static_cast<int>(torch::cuda::device_count());
  const at::Device device(
      at::kCUDA,
      static_cast<c10::DeviceIndex>(rendezvous_info(current_environment()).local_rank % count));
  c10::impl::VirtualGuardImpl(at::kCUDA).setDevice(device);
  return device;
}

Batch batch_on_device(Batch batch, const at::Device& device) {
  if (device.is_cpu()) return batch;
  batch.inputs = batch.inputs.to(device);
  batch.targets = batch.targets.to(device);
  if (batch.layout.positions.defined()) batch.layout.positions = batch.layout.positions.to(device);
  if (batch.layout.segments.defined()) batch.layout.segments = batch.layout.segments.to(device);
  return batch;
}

}  // namespace shardtrain::detail
