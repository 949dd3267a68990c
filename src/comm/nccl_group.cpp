#include "comm/nccl_group.h"

#include <functional>
#include <sstream>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "comm/join.h"

namespace shardtrain::detail {
namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return c10d::ReduceOp::SUM;
    case ReduceOp::kAvg:
      return c10d::ReduceOp::AVG;
    case ReduceOp::kMax:
      return c10d::ReduceOp::MAX;
  }
  return c10d::ReduceOp::SUM;
}

// Wraps c10d's work; `after` runs once the operation is ordered before the caller's stream
// (copying a padded result into place), so it is enqueued, not waited on, by the host.
class NcclWork : public Work {
 public:
  NcclWork(c10::intrusive_ptr<c10d::Work> work, std::string description,
           std::function<void()> after = {})
      : work_(std::move(work)), description_(std::move(description)), after_(std::move(after)) {}

  void wait() override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (waited_) return;
    try {
      work_->wait();
    } catch (const std::exception& e) {
      throw std::runtime_error(description_ + " failed: " + e.what());
    }
    if (after_) after_();
    waited_ = true;
  }
  bool is_completed() override { return work_->isCompleted(); }

 private:
  std::mutex mutex_;
  c10::intrusive_ptr<c10d::Work> work_;
  std::string description_;
  std::function<void()> after_;
  bool waited_ = false;
};

}  // namespace

NcclProcessGroup::NcclProcessGroup(std::string name, c10::intrusive_ptr<c10d::Store> store,
                                   int rank, std::vector<int> global_ranks,
                                   ProcessGroupOptions options)
    : ProcessGroup(std::move(name), rank, std::move(global_ranks)),
      store_(std::move(store)),
      options_(std::move(options)) {
  ranks_per_node_ = options_.ranks_per_node_;
  wait_for_members(*store_, name_, rank_, global_ranks_, options_.timeout_);
  auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
  nccl_options->timeout = options_.timeout_;
  nccl_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(
      c10::make_intrusive<c10d::PrefixStore>("shardtrain/nccl/" + name_ + "/", store_), rank_,
      size(), nccl_options);
}

WorkHandle NcclProcessGroup::all_reduce(at::Tensor tensor, ReduceOp op) {
  check_tensor("all_reduce", tensor);
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions opts;
  opts.reduceOp = to_c10d(op);
  return std::make_shared<NcclWork>(nccl_->allreduce(tensors, opts), "all_reduce on " + name_);
}

WorkHandle NcclProcessGroup::all_gather(at::Tensor input, at::Tensor output) {
  check_tensor("all_gather", input);
  check_tensor("all_gather", output);
  const int64_t numel = output.numel();
  const ShardRange mine = shard_range(numel, size(), rank_);
  TORCH_CHECK(input.numel() == mine.numel, "all_gather: rank ", rank_, " of ", size(), " owns ",
              mine.numel, " of the output's ", numel, " elements but its input has ",
              input.numel());
  const int64_t per_rank = shard_range(numel, size(), 0).numel;
  if (per_rank * size() == numel && input.numel() == per_rank) {
    auto flat_out = output.view({-1});
    auto flat_in = input.view({-1});
    return std::make_shared<NcclWork>(nccl_->_allgather_base(flat_out, flat_in),
                                      "all_gather on " + name_);
  }
  // NCCL gathers equal pieces: pad each rank's piece to ceil(N/size) and drop the padding.
  auto padded_in = at::zeros({per_rank}, input.options());
  padded_in.narrow(0, 0, input.numel()).copy_(input.view({-1}));
  auto padded_out = at::empty({per_rank * size()}, output.options());
  auto work = nccl_->_allgather_base(padded_out, padded_in);
  return std::make_shared<NcclWork>(work, "all_gather on " + name_, [=]() mutable {
    output.view({-1}).copy_(padded_out.narrow(0, 0, numel));
    (void)padded_in;  // alive until the gather finished
  });
}

WorkHandle NcclProcessGroup::reduce_scatter(at::Tensor input, at::Tensor output, ReduceOp op) {
  check_tensor("reduce_scatter", input);
  check_tensor("reduce_scatter", output);
  const int64_t numel = input.numel();
  const ShardRange mine = shard_range(numel, size(), rank_);
  TORCH_CHECK(output.numel() == mine.numel, "reduce_scatter: rank ", rank_, " of ", size(),
              " owns ", mine.numel, " of the input's ", numel, " elements but its output has ",
              output.numel());
  c10d::ReduceScatterOptions opts;
  opts.reduceOp = to_c10d(op);
  const int64_t per_rank = shard_range(numel, size(), 0).numel;
  if (per_rank * size() == numel) {
    auto flat_out = output.view({-1});
    auto flat_in = input.view({-1});
    return std::make_shared<NcclWork>(nccl_->_reduce_scatter_base(flat_out, flat_in, opts),
                                      "reduce_scatter on " + name_);
  }
  auto padded_in = at::zeros({per_rank * size()}, input.options());
  padded_in.narrow(0, 0, numel).copy_(input.view({-1}));
  auto padded_out = at::empty({per_rank}, output.options());
  auto work = nccl_->_reduce_scatter_base(padded_out, padded_in, opts);
  return std::make_shared<NcclWork>(work, "reduce_scatter on " + name_, [=]() mutable {
    output.view({-1}).copy_(padded_out.narrow(0, 0, output.numel()));
    (void)padded_in;
  });
}

WorkHandle NcclProcessGroup::all_to_all(at::Tensor input, at::Tensor output,
                                        std::vector<int64_t> input_splits,
                                        std::vector<int64_t> output_splits) {
  check_tensor("all_to_all", input);
  check_tensor("all_to_all", output);
  check_splits(input, output, input_splits, output_splits);
  return std::make_shared<NcclWork>(
      nccl_->alltoall_base(output, input, output_splits, input_splits), "all_to_all on " + name_);
}

WorkHandle NcclProcessGroup::broadcast(at::Tensor tensor, int root) {
  check_tensor("broadcast", tensor);
  check_peer("broadcast", root);
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  return std::make_shared<NcclWork>(nccl_->broadcast(tensors, opts), "broadcast on " + name_);
}

WorkHandle NcclProcessGroup::send(at::Tensor tensor, int dst, int tag) {
  check_tensor("send", tensor);
  check_peer("send", dst);
  std::vector<at::Tensor> tensors{tensor};
  return std::make_shared<NcclWork>(nccl_->send(tensors, dst, tag), "send on " + name_);
}

WorkHandle NcclProcessGroup::recv(at::Tensor tensor, int src, int tag) {
  check_tensor("recv", tensor);
  check_peer("recv", src);
  std::vector<at::Tensor> tensors{tensor};
  return std::make_shared<NcclWork>(nccl_->recv(tensors, src, tag), "recv on " + name_);
}

WorkHandle NcclProcessGroup::barrier() {
  return std::make_shared<NcclWork>(nccl_->barrier(c10d::BarrierOptions()), "barrier on " + name_);
}

std::shared_ptr<ProcessGroup> NcclProcessGroup::new_group(const std::vector<int>& ranks) {
  SubgroupPlan plan = plan_subgroup(ranks);
  return std::make_shared<NcclProcessGroup>(std::move(plan.name), store_, plan.rank,
                                            std::move(plan.global_ranks), options_);
}

}  // namespace shardtrain::detail
