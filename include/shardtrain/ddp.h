// DistributedDataParallel: replicas of a module on every rank of a group, gradients averaged in
// buckets whose all-reduce starts during backward as soon as each bucket is complete.
#pragma once

#include <torch/nn/module.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/dist.h"
#include "shardtrain/parallel_names.h"

namespace shardtrain {
namespace detail {
class GradAccumulatedHook;
}

struct DDPOptions {
  // Largest bucket, MiB (PyTorch's default 25).
  DDPOptions& bucket_cap_mb(double value) {
    bucket_cap_mb_ = value;
    return *this;
  }
  // The first bucket (the last layers, whose gradients come first) is small so that
  // communication starts early in backward (PyTorch: 1 MiB).
  DDPOptions& first_bucket_cap_mb(double value) {
    first_bucket_cap_mb_ = value;
    return *this;
  }
  // Parameters may receive no gradient in a backward pass (unused branches). Without this, that
  // is an error naming them, since the all-reduce of their bucket would wait forever.
  DDPOptions& find_unused_parameters(bool value) {
    find_unused_parameters_ = value;
    return *this;
  }
  DDPOptions& comm_hook(DDPCommHook value) {
    comm_hook_ = value;
    return *this;
  }
  // Parameters (by their names in the module) DDP leaves alone: not broadcast at construction,
  // not bucketed, not reduced (PyTorch's params_and_buffers_to_ignore). Another wrapper, or a
  // second DDP on another group, takes care of them: expert parallelism's experts, which differ
  // across the group.
  DDPOptions& ignore(std::vector<std::string> names) {
    ignore_ = std::move(names);
    return *this;
  }

  double bucket_cap_mb_ = 25.0;
  double first_bucket_cap_mb_ = 1.0;
  bool find_unused_parameters_ = false;
  DDPCommHook comm_hook_ = DDPCommHook::kNone;
  std::vector<std::string> ignore_;
};

// What one synchronized backward did, for the benchmark: times in seconds since the backward's
// first gradient became ready.
struct DDPTimeline {
  struct Bucket {
    int index = 0;
    int64_t bytes = 0;
    double launched = 0;  // the bucket was complete and its all-reduce was issued
    double start = 0;     // the all-reduce began running (after those issued before it)
    double end = 0;       // the all-reduce finished
  };
  double last_gradient = 0;  // the last gradient of the backward became ready
  double finished = 0;       // every all-reduce finished (end of backward for the caller)
  std::vector<Bucket> buckets;
  // Fraction of all-reduce time (start to end, summed over buckets) that ran while gradients
  // were still being computed.
  double hidden_fraction() const;
};

class DistributedDataParallel {
 public:
  // Collective over `group`: broadcasts rank 0's parameters and buffers to every rank, groups
  // the parameters into buckets (reverse registration order, so buckets fill in the order
  // backward produces gradients) and makes each parameter's .grad a view into its bucket.
  // The module is shared, not copied: keep using it for forward; DDP acts during backward.
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                          std::shared_ptr<ProcessGroup> group, DDPOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // While the returned guard lives, backward passes only accumulate gradients locally; the
  // next backward outside it averages the accumulated sum over the ranks (gradient
  // accumulation with one all-reduce per step).
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp) : ddp_(ddp) { ddp_.sync_ = false; }
    ~NoSync() { ddp_.sync_ = true; }

   private:
    DistributedDataParallel& ddp_;
  };
  NoSync no_sync() { return NoSync(*this); }
  // Averages the gradients accumulated under no_sync() over the ranks now, every bucket at once:
  // for callers whose last backward does not reach every parameter (a pipeline stage's
  // micro-batches end at different times for its different layers). Collective.
  void all_reduce_gradients();
  // Forgets a backward that failed part-way (a collective's error): the next one starts afresh.
  void abandon_backward() { reset_for_next_backward(); }

  torch::nn::Module& module() { return *module_; }
  ProcessGroup& group() { return *group_; }
  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  // Parameter names of each bucket, in bucket order.
  std::vector<std::vector<std::string>> bucket_layout() const;
  const DDPTimeline& last_timeline() const { return timeline_; }

 private:
  struct Bucket;
  at::Tensor grad_view(size_t param) const;
  // Makes parameter `param`'s .grad its view into its bucket (copying what it accumulated).
  void adopt_gradient(size_t param);
  void mark_ready(size_t param);
  void launch(size_t bucket);
  void finish_backward();
  void reset_for_next_backward();

  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<ProcessGroup> group_;
  DDPOptions options_;
  std::vector<std::string> names_;  // by parameter index (registration order)
  std::vector<at::Tensor> params_;
  std::vector<size_t> bucket_of_;   // parameter -> bucket
  std::vector<int64_t> offset_of_;  // parameter -> offset in its bucket
  std::vector<std::unique_ptr<Bucket>> buckets_;
  // A hook after each parameter's gradient accumulation, taken off with this object.
  std::vector<detail::GradAccumulatedHook> hooks_;
  std::vector<bool> ready_;
  size_t next_to_launch_ = 0;
  bool in_backward_ = false;
  bool sync_ = true;
  std::chrono::steady_clock::time_point backward_start_;
  DDPTimeline timeline_;
};

}  // namespace shardtrain
