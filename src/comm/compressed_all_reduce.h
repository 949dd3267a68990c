// compressed_all_reduce's two implementations (shardtrain/optimizers.h): the CPU's fused loops,
// and tensor operations for any device (CUDA), which the tests also run on the CPU.
#pragma once

#include "shardtrain/optimizers.h"

namespace shardtrain::detail {

void compressed_all_reduce_by_tensor_ops(ProcessGroup& group, at::Tensor tensor,
                                         CompressionErrors& errors);

}  // namespace shardtrain::detail
