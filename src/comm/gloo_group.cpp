#include "comm/gloo_group.h"

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <cstring>
#include <map>
#include <sstream>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "comm/gloo_ring.h"
#include "comm/join.h"

namespace shardtrain::detail {
namespace {

// Gloo's rendezvous speaks its own store interface; this forwards it to the c10d store.
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  explicit GlooStoreAdapter(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, std::vector<uint8_t>(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    auto value = store_->get(key);
    return std::vector<char>(value.begin(), value.end());
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, timeout);
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

// Gloo's connectFullMesh takes the store by reference up to 2022 (Debian's libgloo) and as a
// shared_ptr since (the gloo inside PyTorch 2.x wheels); the overload that compiles is chosen.
template <typename Context>
auto connect_full_mesh(Context& context, const std::shared_ptr<GlooStoreAdapter>& store,
                       std::shared_ptr<gloo::transport::Device>& device, int)
    -> decltype(context.connectFullMesh(store, device), void()) {
  context.connectFullMesh(store, device);
}
template <typename Context>
void connect_full_mesh(Context& context, const std::shared_ptr<GlooStoreAdapter>& store,
                       std::shared_ptr<gloo::transport::Device>& device, long) {
  context.connectFullMesh(*store, device);
}

// Gloo's templated options only use the element type for its size; the reduction itself is
// the dtype-aware function passed beside it.
template <typename F>
void with_element_size(size_t size, F&& f) {
  switch (size) {
    case 1:
      return f(uint8_t{});
    case 2:
      return f(uint16_t{});
    case 4:
      return f(uint32_t{});
    case 8:
      return f(uint64_t{});
    default:
      TORCH_CHECK(false, "unsupported element size ", size);
  }
}

constexpr uint8_t kPointToPointSlotPrefix = 0x71;

// A send or recv posted on the caller's thread; wait() waits on the transport.
class PointToPointWork : public Work {
 public:
  PointToPointWork(std::unique_ptr<gloo::transport::UnboundBuffer> buffer, at::Tensor tensor,
                   bool is_send, std::chrono::milliseconds timeout, std::string description)
      : buffer_(std::move(buffer)),
        tensor_(std::move(tensor)),
        is_send_(is_send),
        timeout_(timeout),
        description_(std::move(description)) {}

  void wait() override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_) {
      if (!error_.empty()) throw std::runtime_error(error_);
      return;
    }
    try {
      if (is_send_) {
        buffer_->waitSend(timeout_);
      } else {
        buffer_->waitRecv(timeout_);
      }
    } catch (const std::exception& e) {
      error_ = description_ + " failed: " + e.what();
    }
    done_ = true;
    if (!error_.empty()) throw std::runtime_error(error_);
  }
  // The transport has no non-blocking poll, so completion is known once wait() returned.
  bool is_completed() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_;
  }

 private:
  std::mutex mutex_;
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer_;
  at::Tensor tensor_;  // keeps the memory alive until the transfer finished
  bool is_send_;
  std::chrono::milliseconds timeout_;
  std::string description_;
  bool done_ = false;
  std::string error_;
};

// Every rank's transport address (host only), gathered once so that a failure can name the host
// of a peer even when the store is out of reach by then.
std::vector<std::string> exchange_hosts(const std::shared_ptr<gloo::Context>& context) {
  const int size = context->size;
  if (size == 1) return {""};
  constexpr size_t kWidth = 64;
  std::string own = context->getPair((context->rank + 1) % size)->address().str();
  own = own.substr(0, own.rfind(':'));  // "[10.0.0.1]:4321" -> "[10.0.0.1]"
  if (own.size() > 2 && own.front() == '[' && own.back() == ']')
    own = own.substr(1, own.size() - 2);
  std::vector<char> mine(kWidth, 0), all(kWidth * size, 0);
  std::memcpy(mine.data(), own.data(), std::min(own.size(), kWidth - 1));
  gloo::AllgatherOptions opts(context);
  opts.setInput(mine.data(), kWidth);
  opts.setOutput(all.data(), all.size());
  gloo::allgather(opts);
  std::vector<std::string> hosts;
  for (int rank = 0; rank < size; ++rank) hosts.emplace_back(all.data() + rank * kWidth);
  return hosts;
}

}  // namespace

std::shared_ptr<gloo::transport::Device> make_gloo_device(const ProcessGroupOptions& options) {
  gloo::transport::tcp::attr attr;
  if (!options.interface_.empty()) {
    detail::check_interface(options.interface_);
    attr.iface = options.interface_;
  } else {
    attr.hostname = options.hostname_.empty() ? "127.0.0.1" : options.hostname_;
  }
  return gloo::transport::tcp::CreateDevice(attr);
}

GlooProcessGroup::GlooProcessGroup(std::string name, c10::intrusive_ptr<c10d::Store> store,
                                   int rank, std::vector<int> global_ranks,
                                   ProcessGroupOptions options,
                                   std::shared_ptr<gloo::transport::Device> device)
    : ProcessGroup(std::move(name), rank, std::move(global_ranks)),
      store_(std::move(store)),
      options_(std::move(options)),
      device_(std::move(device)) {
  ranks_per_node_ = options_.ranks_per_node_;
  wait_for_members(*store_, name_, rank_, global_ranks_, options_.timeout_);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank_, size());
  context->setTimeout(options_.timeout_);
  auto adapter = std::make_shared<GlooStoreAdapter>(
      c10::make_intrusive<c10d::PrefixStore>("shardtrain/gloo/" + name_ + "/", store_));
  try {
    connect_full_mesh(*context, adapter, device_, 0);
  } catch (const std::exception& e) {
    throw std::runtime_error("connecting group '" + name_ + "' (global ranks " +
                             join_ranks(global_ranks_) + ") failed on rank " +
                             std::to_string(global_ranks_[rank_]) + ": " + e.what());
  }
  context_ = std::move(context);
  hosts_ = exchange_hosts(context_);
  worker_ = std::thread([this] { worker_loop(); });
}

GlooProcessGroup::~GlooProcessGroup() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

std::string GlooProcessGroup::describe(const char* op) const {
  std::ostringstream out;
  out << op << " on group '" << name_ << "' (rank " << rank_ << " of " << size() << ", global rank "
      << global_ranks_[rank_] << ")";
  return out.str();
}

WorkHandle GlooProcessGroup::enqueue(const char* op, int64_t bytes,
                                     std::function<void(uint32_t)> run) {
  auto work = std::make_shared<CompletionWork>(op);
  // A group of one rank only copies locally: nothing to count as communication.
  const std::shared_ptr<Telemetry> telemetry = size() > 1 ? current_telemetry() : nullptr;
  const bool traced = telemetry && telemetry->tracing();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!broken_.empty()) {
      throw std::runtime_error(describe(op) + " refused: the group failed earlier: " + broken_);
    }
    queue_.push_back(Task{work, std::move(run), op, next_tag_++, bytes, telemetry, traced});
  }
  queue_cv_.notify_one();
  return work;
}

void GlooProcessGroup::worker_loop() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      queue_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to run
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    std::exception_ptr error;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (!broken_.empty()) {
        error = std::make_exception_ptr(std::runtime_error(
            describe(task.op.c_str()) + " refused: the group failed earlier: " + broken_));
      }
    }
    if (!error) {
      try {
        task.work->start();
        task.run(task.tag);
      } catch (const std::exception& e) {
        const std::string message =
            describe(task.op.c_str()) + " failed: " + e.what() + peers_of(e);
        std::lock_guard<std::mutex> lock(mutex_);
        broken_ = message;
        error = std::make_exception_ptr(std::runtime_error(message));
      }
    }
    // Counted before the waiter wakes, so that a step's totals hold every operation it waited on.
    if (task.telemetry && !error) {
      try {
        record(task, std::chrono::steady_clock::now());
      } catch (const std::exception&) {
        // Out of memory for a span: the operation itself succeeded; its record is lost.
      }
    }
    task.work->finish(error);
  }
}

std::string GlooProcessGroup::peers_of(const std::exception& error) const {
  std::map<std::string, std::vector<int>> others;
  for (int rank = 0; rank < size(); ++rank) {
    if (hosts_[rank] != hosts_[rank_]) others[hosts_[rank]].push_back(global_ranks_[rank]);
  }
  std::string elsewhere;
  for (const auto& [host, ranks] : others) {
    elsewhere +=
        (elsewhere.empty() ? "" : "; ") + std::string("ranks ") + join_ranks(ranks) + " at " + host;
  }
  const auto* peer = dynamic_cast<const PeerError*>(&error);
  if (!peer)
    return elsewhere.empty() ? "" : " (the group's ranks on other hosts: " + elsewhere + ")";
  std::string text = std::string(" (") +
                     (peer->receiving ? "waiting for data from" : "sending to") + " global rank " +
                     std::to_string(global_ranks_[peer->peer]) + " at " + hosts_[peer->peer] +
                     ": stopped, dead or unreachable?";
  // A peer on this host may itself be waiting on another host: name those too.
  if (hosts_[peer->peer] == hosts_[rank_] && !elsewhere.empty()) {
    text += " The group's ranks on other hosts: " + elsewhere;
  }
  return text + ")";
}

void GlooProcessGroup::record(const Task& task, std::chrono::steady_clock::time_point end) const {
  const auto start = task.work->started_at();
  task.telemetry->add_communication(std::chrono::duration<double>(end - start).count(), task.bytes);
  if (!task.traced) return;
  // The sequence number is the group's operation count, the same on every member, so a trace
  // shows which operations of different ranks are one collective.
  task.telemetry->add_span_on("comm " + name_, task.op, "comm", start, end,
                              {{"op", task.op},
                               {"bytes", task.bytes},
                               {"group", name_},
                               {"group_size", size()},
                               {"seq", task.tag}});
}

WorkHandle GlooProcessGroup::all_reduce(at::Tensor tensor, ReduceOp op) {
  check_tensor("all_reduce", tensor);
  const ReduceFn fn = reduce_fn(tensor.scalar_type(), op);
  const AverageFn average = op == ReduceOp::kAvg ? average_fn(tensor.scalar_type()) : nullptr;
  if (tensor.numel() == 0 || size() == 1) return std::make_shared<CompletedWork>();
  // A ring reduce-scatter into this rank's own slice (the average folded into its last step),
  // then an in-place all-gather of the slices: the bytes of a ring all-reduce, with every
  // segment of the reduce-scatter in flight at once and no pass of its own for the average.
  return enqueue("all_reduce", static_cast<int64_t>(tensor.nbytes()),
                 [this, tensor, fn, average](uint32_t tag) mutable {
                   const size_t elem_size = tensor.element_size();
                   char* data = static_cast<char*>(tensor.data_ptr());
                   const ShardRange mine = shard_range(tensor.numel(), size(), rank_);
                   ring_reduce_scatter(context_, data, data + mine.offset * elem_size,
                                       tensor.numel(), elem_size, fn, average, tag,
                                       options_.timeout_, ring_workspace_);
                   gather_slices(nullptr, data, tensor.numel(), elem_size, tag);
                 });
}

void GlooProcessGroup::gather_slices(const void* input, void* output, int64_t numel,
                                     size_t elem_size, uint32_t tag) {
  std::vector<size_t> counts(size());
  for (int r = 0; r < size(); ++r) counts[r] = shard_range(numel, size(), r).numel;
  gloo::AllgathervOptions opts(context_);
  with_element_size(elem_size, [&](auto element) {
    using T = decltype(element);
    if (input) opts.setInput(static_cast<T*>(const_cast<void*>(input)), counts[rank_]);
    opts.setOutput(static_cast<T*>(output), counts);
  });
  opts.setTag(tag);
  opts.setTimeout(options_.timeout_);
  gloo::allgatherv(opts);
}

WorkHandle GlooProcessGroup::all_gather(at::Tensor input, at::Tensor output) {
  check_tensor("all_gather", input);
  check_tensor("all_gather", output);
  TORCH_CHECK(input.scalar_type() == output.scalar_type(), "all_gather: input dtype ",
              input.scalar_type(), " differs from output dtype ", output.scalar_type());
  const ShardRange mine = shard_range(output.numel(), size(), rank_);
  TORCH_CHECK(input.numel() == mine.numel, "all_gather: rank ", rank_, " of ", size(), " owns ",
              mine.numel, " of the output's ", output.numel(), " elements but its input has ",
              input.numel());
  if (output.numel() == 0) return std::make_shared<CompletedWork>();
  return enqueue("all_gather", static_cast<int64_t>(output.nbytes()),
                 [this, input, output](uint32_t tag) mutable {
                   if (size() == 1) {
                     output.copy_(input.view_as(output));
                     return;
                   }
                   gather_slices(input.data_ptr(), output.data_ptr(), output.numel(),
                                 output.element_size(), tag);
                 });
}

WorkHandle GlooProcessGroup::reduce_scatter(at::Tensor input, at::Tensor output, ReduceOp op) {
  check_tensor("reduce_scatter", input);
  check_tensor("reduce_scatter", output);
  TORCH_CHECK(input.scalar_type() == output.scalar_type(), "reduce_scatter: input dtype ",
              input.scalar_type(), " differs from output dtype ", output.scalar_type());
  const ShardRange mine = shard_range(input.numel(), size(), rank_);
  TORCH_CHECK(output.numel() == mine.numel, "reduce_scatter: rank ", rank_, " of ", size(),
              " owns ", mine.numel, " of the input's ", input.numel(),
              " elements but its output has ", output.numel());
  const ReduceFn fn = reduce_fn(input.scalar_type(), op);
  const AverageFn average = op == ReduceOp::kAvg ? average_fn(input.scalar_type()) : nullptr;
  if (input.numel() == 0) return std::make_shared<CompletedWork>();
  return enqueue("reduce_scatter", static_cast<int64_t>(input.nbytes()),
                 [this, input, output, fn, average](uint32_t tag) mutable {
                   ring_reduce_scatter(context_, input.data_ptr(), output.data_ptr(), input.numel(),
                                       input.element_size(), fn, average, tag, options_.timeout_,
                                       ring_workspace_);
                 });
}

WorkHandle GlooProcessGroup::all_to_all(at::Tensor input, at::Tensor output,
                                        std::vector<int64_t> input_splits,
                                        std::vector<int64_t> output_splits) {
  check_tensor("all_to_all", input);
  check_tensor("all_to_all", output);
  const int64_t row = check_splits(input, output, input_splits, output_splits);
  if (size() == 1) {
    output.copy_(input);
    return std::make_shared<CompletedWork>();
  }
  // Every member takes part even with nothing to move: the group's operations stay in step.
  return enqueue("all_to_all", static_cast<int64_t>(input.nbytes()),
                 [this, input, output, row, input_splits, output_splits](uint32_t tag) mutable {
                   std::vector<int64_t> sent, received;
                   for (int64_t rows : input_splits) sent.push_back(rows * row);
                   for (int64_t rows : output_splits) received.push_back(rows * row);
                   // Gloo wants buffers behind its pointers even for no elements.
                   const at::Tensor spare = at::empty({1}, input.options());
                   void* in = input.numel() > 0 ? input.data_ptr() : spare.data_ptr();
                   void* out = output.numel() > 0 ? output.data_ptr() : spare.data_ptr();
                   gloo::AlltoallvOptions opts(context_);
                   with_element_size(input.element_size(), [&](auto element) {
                     using T = decltype(element);
                     opts.setInput(static_cast<T*>(in), sent);
                     opts.setOutput(static_cast<T*>(out), received);
                   });
                   opts.setTag(tag);
                   opts.setTimeout(options_.timeout_);
                   gloo::alltoallv(opts);
                 });
}

WorkHandle GlooProcessGroup::broadcast(at::Tensor tensor, int root) {
  check_tensor("broadcast", tensor);
  check_peer("broadcast", root);
  if (tensor.numel() == 0 || size() == 1) return std::make_shared<CompletedWork>();
  return enqueue("broadcast", static_cast<int64_t>(tensor.nbytes()),
                 [this, tensor, root](uint32_t tag) mutable {
                   gloo::BroadcastOptions opts(context_);
                   with_element_size(tensor.element_size(), [&](auto element) {
                     using T = decltype(element);
                     opts.setOutput(static_cast<T*>(tensor.data_ptr()), tensor.numel());
                   });
                   opts.setRoot(root);
                   opts.setTag(tag);
                   opts.setTimeout(options_.timeout_);
                   gloo::broadcast(opts);
                 });
}

WorkHandle GlooProcessGroup::send(at::Tensor tensor, int dst, int tag) {
  check_tensor("send", tensor);
  check_peer("send", dst);
  TORCH_CHECK(dst != rank_, "send: rank ", rank_, " cannot send to itself");
  auto buffer = context_->createUnboundBuffer(tensor.data_ptr(), tensor.nbytes());
  buffer->send(dst, gloo::Slot::build(kPointToPointSlotPrefix, static_cast<uint32_t>(tag)));
  return std::make_shared<PointToPointWork>(std::move(buffer), tensor, true, options_.timeout_,
                                            describe("send") + " to rank " + std::to_string(dst));
}

WorkHandle GlooProcessGroup::recv(at::Tensor tensor, int src, int tag) {
  check_tensor("recv", tensor);
  check_peer("recv", src);
  TORCH_CHECK(src != rank_, "recv: rank ", rank_, " cannot receive from itself");
  auto buffer = context_->createUnboundBuffer(tensor.data_ptr(), tensor.nbytes());
  buffer->recv(src, gloo::Slot::build(kPointToPointSlotPrefix, static_cast<uint32_t>(tag)));
  return std::make_shared<PointToPointWork>(std::move(buffer), tensor, false, options_.timeout_,
                                            describe("recv") + " from rank " + std::to_string(src));
}

WorkHandle GlooProcessGroup::barrier() { return barrier_within(options_.timeout_); }

WorkHandle GlooProcessGroup::barrier_within(std::chrono::milliseconds timeout) {
  return enqueue("barrier", 0, [this, timeout](uint32_t tag) {
    if (size() == 1) return;
    gloo::BarrierOptions opts(context_);
    opts.setTag(tag);
    opts.setTimeout(timeout);
    gloo::barrier(opts);
  });
}

std::shared_ptr<ProcessGroup> GlooProcessGroup::new_group(const std::vector<int>& ranks) {
  SubgroupPlan plan = plan_subgroup(ranks);
  return std::make_shared<GlooProcessGroup>(std::move(plan.name), store_, plan.rank,
                                            std::move(plan.global_ranks), options_, device_);
}

}  // namespace shardtrain::detail
