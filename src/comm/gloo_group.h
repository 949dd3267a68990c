// The Gloo process group: one Gloo context per group, collectives from Gloo's library run in
// issue order on one worker thread per group, point-to-point posted on the caller's thread.
#pragma once

#include <gloo/context.h>
#include <gloo/transport/device.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "comm/work.h"
#include "shardtrain/dist.h"
#include "trace/telemetry.h"

namespace shardtrain::detail {

class GlooProcessGroup : public ProcessGroup {
 public:
  // Connects to the other members through `store` (keys are prefixed with `name`). Blocking.
  GlooProcessGroup(std::string name, c10::intrusive_ptr<c10d::Store> store, int rank,
                   std::vector<int> global_ranks, ProcessGroupOptions options,
                   std::shared_ptr<gloo::transport::Device> device);
  ~GlooProcessGroup() override;

  Backend backend() const override { return Backend::kGloo; }
  WorkHandle all_reduce(at::Tensor tensor, ReduceOp op) override;
  WorkHandle all_gather(at::Tensor input, at::Tensor output) override;
  WorkHandle reduce_scatter(at::Tensor input, at::Tensor output, ReduceOp op) override;
  WorkHandle all_to_all(at::Tensor input, at::Tensor output, std::vector<int64_t> input_splits,
                        std::vector<int64_t> output_splits) override;
  WorkHandle broadcast(at::Tensor tensor, int root) override;
  WorkHandle send(at::Tensor tensor, int dst, int tag) override;
  WorkHandle recv(at::Tensor tensor, int src, int tag) override;
  WorkHandle barrier() override;
  WorkHandle barrier_within(std::chrono::milliseconds timeout) override;
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) override;

 private:
  // Queues `run` for the worker thread; its exception fails the returned handle, named after
  // `op`, and breaks the group: later operations fail at once with the same cause. `bytes` (the
  // size of the operation's tensor) and its time go to the caller's telemetry, if any.
  WorkHandle enqueue(const char* op, int64_t bytes, std::function<void(uint32_t tag)> run);
  // Gloo's ring all-gather of every rank's shard_range slice of the flat `output` (numel
  // elements); `input` is this rank's slice, or null when it is in `output` already. Worker only.
  void gather_slices(const void* input, void* output, int64_t numel, size_t elem_size,
                     uint32_t tag);
  void worker_loop();
  std::string describe(const char* op) const;
  // Where a failed operation's peers are: the peer of a PeerError, else the group's other hosts.
  std::string peers_of(const std::exception& error) const;

  c10::intrusive_ptr<c10d::Store> store_;
  ProcessGroupOptions options_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  std::vector<std::string> hosts_;  // the transport address of each rank of the group

  struct Task {
    std::shared_ptr<CompletionWork> work;
    std::function<void(uint32_t)> run;
    std::string op;
    uint32_t tag;
    int64_t bytes;
    std::shared_ptr<Telemetry> telemetry;  // of the rank that issued it; may be null
    bool traced;                           // issued while that rank was tracing
  };
  // Adds a task that ran until `end` to the telemetry it was issued under.
  void record(const Task& task, std::chrono::steady_clock::time_point end) const;
  std::mutex mutex_;
  std::condition_variable queue_cv_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  uint32_t next_tag_ = 0;
  std::string broken_;  // first failure; non-empty means the group is unusable
  std::thread worker_;
  std::vector<char> ring_workspace_;  // only the worker thread touches it
};

// The Gloo TCP device for `options`: an interface when given, else the hostname.
std::shared_ptr<gloo::transport::Device> make_gloo_device(const ProcessGroupOptions& options);

}  // namespace shardtrain::detail
