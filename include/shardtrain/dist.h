// Process groups over real communication engines (Gloo on CPU, NCCL on CUDA), the work handles
// their asynchronous operations return, and the flat shard layout every sharded collective uses.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace c10d {
class Store;
}

namespace shardtrain {

enum class ReduceOp { kSum, kAvg, kMax };
enum class Backend { kGloo, kNccl };

std::string to_string(ReduceOp op);
std::string to_string(Backend backend);
// Parses "gloo" or "nccl"; throws naming the value otherwise.
Backend backend_from_string(const std::string& name);

// The slice of a flat tensor of `numel` elements that rank `rank` of `world_size` owns: every
// rank gets ceil(numel / world_size) elements except at the end, where the last slices are
// shorter or empty. reduce_scatter and all_gather use this layout when numel does not divide.
struct ShardRange {
  int64_t offset = 0;
  int64_t numel = 0;
};
ShardRange shard_range(int64_t numel, int world_size, int rank);

// Handle to an asynchronous operation. wait() blocks until the operation finished on this rank
// and rethrows its error (a timeout, a dead peer) as a std::runtime_error naming the operation,
// the group and the rank. The tensors passed to the operation must stay alive and untouched
// until wait() returns. Handles may be waited on from any thread, any number of times.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  // True once the operation finished, successfully or not. Never blocks.
  virtual bool is_completed() = 0;
  // When the operation finished on this rank (steady clock), once is_completed(); the clock's
  // epoch where the backend cannot tell.
  virtual std::chrono::steady_clock::time_point finished_at() { return {}; }
  // When the operation began running on this rank, after the operations issued before it on
  // the same group, once is_completed(); the clock's epoch where the backend cannot tell.
  virtual std::chrono::steady_clock::time_point started_at() { return {}; }
};
using WorkHandle = std::shared_ptr<Work>;

struct ProcessGroupOptions {
  // Limit for each operation (and for connecting the group): past it, the operation fails.
  ProcessGroupOptions& timeout(std::chrono::milliseconds value) {
    timeout_ = value;
    return *this;
  }
  ProcessGroupOptions& backend(Backend value) {
    backend_ = value;
    return *this;
  }
  // Address other ranks reach this process on (Gloo). Empty: the host's name, or loopback
  // when the store itself is on loopback.
  ProcessGroupOptions& hostname(std::string value) {
    hostname_ = std::move(value);
    return *this;
  }
  // Network interface to bind instead of a hostname (Gloo), like GLOO_SOCKET_IFNAME.
  ProcessGroupOptions& interface(std::string value) {
    interface_ = std::move(value);
    return *this;
  }
  // Ranks on each node, as the launcher said (init_from_environment sets it from the
  // rendezvous); 0: not known. Its subgroups carry the same number.
  ProcessGroupOptions& ranks_per_node(int value) {
    ranks_per_node_ = value;
    return *this;
  }

  std::chrono::milliseconds timeout_{std::chrono::minutes(5)};
  Backend backend_ = Backend::kGloo;
  std::string hostname_;
  std::string interface_;
  int ranks_per_node_ = 0;
};

// A set of ranks that communicate. Every collective (all_reduce, all_gather, reduce_scatter,
// broadcast, barrier) is collective over the group: each member must call it, in the same order
// as the other members, with tensors of the same dtype and matching sizes. Collectives on one
// group run one after another in the order they were issued; groups progress independently.
// send/recv are point-to-point: only the two ranks involved call them.
// Tensors must be contiguous and on the group's device (CPU for Gloo, CUDA for NCCL). Supported
// dtypes: float32, float64, bfloat16, float16, int32, int64, uint8.
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  // Rank of this process inside the group, and the number of members.
  int rank() const { return rank_; }
  int size() const { return static_cast<int>(global_ranks_.size()); }
  // Global rank of each member, in group-rank order.
  const std::vector<int>& global_ranks() const { return global_ranks_; }
  const std::string& name() const { return name_; }
  virtual Backend backend() const = 0;
  // Ranks on each node of the job (ProcessGroupOptions::ranks_per_node); 0: not known.
  int ranks_per_node() const { return ranks_per_node_; }

  // In place: afterwards every member holds the reduction of all members' `tensor`.
  virtual WorkHandle all_reduce(at::Tensor tensor, ReduceOp op = ReduceOp::kSum) = 0;
  // `output` (numel N) receives every member's `input`, laid out by shard_range(N, size, r):
  // input.numel() must equal that range's numel for this rank. With N divisible by the size
  // this is the plain concatenation in rank order.
  virtual WorkHandle all_gather(at::Tensor input, at::Tensor output) = 0;
  // Reduces the flat `input` (numel N) over all members and leaves in `output` this rank's
  // slice of the result, shard_range(N, size, rank). Moves (size-1)/size of N per rank: it is a
  // ring over the transport, not an all-reduce followed by a slice. `output` may be that slice
  // of `input` itself (in place; the rest of `input` is then left as it was).
  virtual WorkHandle reduce_scatter(at::Tensor input, at::Tensor output,
                                    ReduceOp op = ReduceOp::kSum) = 0;
  // Rows (slices along dim 0) to and from every member, as torch's all_to_all_single: this rank
  // sends input_splits[r] rows of `input`, in order, to rank r and receives output_splits[r] rows
  // from rank r into `output`, in rank order. The splits must add up to the tensors' rows, and
  // rank r's input_splits[me] equal my output_splits[r] (exchange the counts first when they are
  // not known: an all_to_all of one int64 per rank). Empty splits: equal ones. Every member
  // calls it, even with nothing to send or receive.
  virtual WorkHandle all_to_all(at::Tensor input, at::Tensor output,
                                std::vector<int64_t> input_splits,
                                std::vector<int64_t> output_splits) = 0;
  // In place: every member's `tensor` becomes root's. `root` is a group rank.
  virtual WorkHandle broadcast(at::Tensor tensor, int root) = 0;
  // Point-to-point with group ranks `dst`/`src`. A send matches the recv posted by its peer
  // with the same tag; both sides must use the same numel and dtype.
  virtual WorkHandle send(at::Tensor tensor, int dst, int tag = 0) = 0;
  virtual WorkHandle recv(at::Tensor tensor, int src, int tag = 0) = 0;
  virtual WorkHandle barrier() = 0;
  // A barrier that waits up to `timeout` instead of the group's own (for a phase known to take
  // long on some ranks, such as writing a checkpoint). Backends without per-operation timeouts
  // (NCCL) wait as barrier() does.
  virtual WorkHandle barrier_within(std::chrono::milliseconds timeout) {
    (void)timeout;
    return barrier();
  }

  // Creates the group of `ranks` (group ranks of this group, in the order they get in the new
  // group). Only the listed ranks call it, each with the same list; a rank outside the list
  // gets an error. Blocks until every listed rank has joined or the timeout passes.
  virtual std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) = 0;

 protected:
  ProcessGroup(std::string name, int rank, std::vector<int> global_ranks)
      : name_(std::move(name)), rank_(rank), global_ranks_(std::move(global_ranks)) {}
  // Checks the arguments shared by all backends and throws naming what is wrong.
  void check_tensor(const char* op, const at::Tensor& tensor) const;
  void check_peer(const char* op, int peer) const;
  // all_to_all's splits checked against the tensors (equal ones filled in); throws naming what
  // does not add up. Returns the elements of one row.
  int64_t check_splits(const at::Tensor& input, const at::Tensor& output,
                       std::vector<int64_t>& input_splits,
                       std::vector<int64_t>& output_splits) const;

  // What new_group(ranks) creates on this rank, after checking the list.
  struct SubgroupPlan {
    std::string name;  // the same on every member
    int rank = -1;     // this rank inside the subgroup
    std::vector<int> global_ranks;
  };
  SubgroupPlan plan_subgroup(const std::vector<int>& ranks);

  std::string name_;
  int rank_;
  std::vector<int> global_ranks_;
  int ranks_per_node_ = 0;

 private:
  std::mutex subgroups_mutex_;
  std::map<std::string, int> subgroup_count_;  // how often each member list was split off
};

// Connects `world_size` processes through `store` and returns the world group. Every rank calls
// it. Before connecting, each rank announces itself in the store and waits up to the timeout for
// the others; a rank that never joins is named in the error. Blocking.
std::shared_ptr<ProcessGroup> init_process_group(c10::intrusive_ptr<c10d::Store> store, int rank,
                                                 int world_size,
                                                 const ProcessGroupOptions& options = {});

}  // namespace shardtrain
