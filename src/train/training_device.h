// Where a run trains (run.device): the GPU a process takes, and its batches moved there.
#pragma once

#include <ATen/ATen.h>

#include "shardtrain/data.h"

namespace shardtrain::detail {

// The GPU of this process under run.device = "cuda": LOCAL_RANK's, modulo the GPUs visible,
// made the calling thread's current device. Throws std::invalid_argument, naming run.device,
// where no GPU is visible or LibTorch has no CUDA.
at::Device cuda_device_of_this_rank();

// `batch`'s tensors on `device` (the loader makes them on the CPU); on the CPU, `batch` as it is.
Batch batch_on_device(Batch batch, const at::Device& device);

}  // namespace shardtrain::detail
