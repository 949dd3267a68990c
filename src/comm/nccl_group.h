// The NCCL process group (CUDA builds only): a thin wrapper over c10d's ProcessGroupNCCL that
// gives it shardtrain's interface, including the uneven flat shard layout.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "shardtrain/dist.h"

namespace shardtrain::detail {

class NcclProcessGroup : public ProcessGroup {
 public:
  // Joins the other members through `store`, then creates the NCCL communicator lazily on the
  // first collective (as c10d does). Tensors must be on this rank's current CUDA device.
  NcclProcessGroup(std::string name, c10::intrusive_ptr<c10d::Store> store, int rank,
                   std::vector<int> global_ranks, ProcessGroupOptions options);

  Backend backend() const override { return Backend::kNccl; }
  WorkHandle all_reduce(at::Tensor tensor, ReduceOp op) override;
  WorkHandle all_gather(at::Tensor input, at::Tensor output) override;
  WorkHandle reduce_scatter(at::Tensor input, at::Tensor output, ReduceOp op) override;
  WorkHandle all_to_all(at::Tensor input, at::Tensor output, std::vector<int64_t> input_splits,
                        std::vector<int64_t> output_splits) override;
  WorkHandle broadcast(at::Tensor tensor, int root) override;
  WorkHandle send(at::Tensor tensor, int dst, int tag) override;
  WorkHandle recv(at::Tensor tensor, int src, int tag) override;
  WorkHandle barrier() override;
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) override;

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  ProcessGroupOptions options_;
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl_;
};

}  // namespace shardtrain::detail
