// Ring attention (Liu et al. 2023, with the load-balanced causal split of Brandon et al. and
// torchtitan): the keys and values of each rank's chunks travel around the cp group, one hop
// per step, while every rank computes its queries' attention over the block it holds; partial
// results merge by their log-sum-exps. Backward runs the same ring for the keys and values, and
// a second ring carries each block's key/value gradients, summed as they pass, back to the
// block's owner.
#include "parallel/context/ring_attention.h"

#include <torch/csrc/autograd/custom_function.h>

#include <chrono>
#include <future>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trace/telemetry.h"

namespace shardtrain::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int kKeysTag = 0;
constexpr int kGradsTag = 1;

struct Ring {
  ProcessGroup* group = nullptr;
  int rank = 0, size = 1;
  int next() const { return (rank + 1) % size; }
  int previous() const { return (rank + size - 1) % size; }
  // The rank whose block this rank holds `step` hops into the ring.
  int source(int step) const { return (rank - step + size) % size; }
};

// This rank's queries' positions and segments, and for packed samples every rank's segments
// [size, B, Tl]. Not tensor arguments of the autograd function, which would take the undefined
// ones for inputs.
struct RingMask {
  AttentionMask local;
  at::Tensor all_segments;
};

// The mask of this rank's queries against `source`'s keys: its chunks' positions and, packed,
// its segments.
AttentionMask mask_against(const AttentionMask& local, const at::Tensor& all_segments, int source,
                           int size) {
  AttentionMask mask = local;
  const int64_t length = local.query_positions.numel() * size;
  mask.key_positions = context_positions(length, source, size).to(local.query_positions.device());
  if (all_segments.defined()) mask.key_segments = all_segments[source];
  return mask;
}

// Posts the exchange of one hop: `outgoing` to the next rank, the previous rank's block into a
// new tensor. Both sides post their send before waiting, so no rank blocks another. The time
// wait() blocks is exposed communication (the run's metrics count it); while tracing, a thread
// waits for the transfer as soon as it is posted, so that the trace has the hop's own span
// ("ring hop", comm) beside the wait's, and the share hidden behind the compute between them is
// measured rather than guessed (Gloo's point-to-point transfers cannot be polled).
class Hop {
 public:
  using Clock = std::chrono::steady_clock;
  Hop(const Ring& ring, const at::Tensor& outgoing, int tag)
      : incoming_(at::empty_like(outgoing)), posted_(Clock::now()) {
    sent_ = ring.group->send(outgoing, ring.next(), tag);
    received_ = ring.group->recv(incoming_, ring.previous(), tag);
    const std::shared_ptr<Telemetry>& telemetry = current_telemetry();
    if (telemetry && telemetry->tracing()) {
      bytes_ = static_cast<int64_t>(outgoing.nbytes());
      row_ = "comm " + ring.group->name();
      transferred_ = std::async(std::launch::async, [sent = sent_, received = received_] {
        sent->wait();
        received->wait();
        return Clock::now();
      });
    }
  }
  at::Tensor wait() {
    const Clock::time_point start = Clock::now();
    if (!transferred_.valid()) {
      sent_->wait();
      received_->wait();
      record_comm_wait("ring hop", start, Clock::now());
      return incoming_;
    }
    const Clock::time_point done = transferred_.get();
    record_comm_wait("ring hop", start, Clock::now());
    if (const std::shared_ptr<Telemetry>& telemetry = current_telemetry()) {
      telemetry->add_communication(std::chrono::duration<double>(done - posted_).count(), bytes_);
      telemetry->add_span_on(row_, "ring hop", "comm", posted_, done, {{"bytes", bytes_}});
    }
    return incoming_;
  }

 private:
  at::Tensor incoming_;
  WorkHandle sent_, received_;
  Clock::time_point posted_;
  std::future<Clock::time_point> transferred_;
  int64_t bytes_ = 0;
  std::string row_;
};

class RingAttentionFunction : public torch::autograd::Function<RingAttentionFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, Ring ring, const RingMask& mask) {
    const AttentionMask& local = mask.local;
    const at::Tensor& all_segments = mask.all_segments;
    // k and v travel as one tensor: one message per hop.
    at::Tensor block = at::stack({k, v}).contiguous();
    AttentionPart merged;
    for (int step = 0; step < ring.size; ++step) {
      std::optional<Hop> hop;
      if (step + 1 < ring.size) hop.emplace(ring, block, kKeysTag);
      const AttentionPart part = attention_part(
          q, block[0], block[1], mask_against(local, all_segments, ring.source(step), ring.size));
      if (step == 0) {
        merged = part;
      } else {
        merge_attention_part(merged, part);
      }
      if (hop) block = hop->wait();
    }
    at::Tensor out = merged.out.to(q.scalar_type());
    ctx->save_for_backward(
        {q, k, v, out, merged.lse, local.query_positions, local.query_segments, all_segments});
    // The group outlives the step (ring_split's contract); saved_data holds no C++ pointers.
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(ring.group);
    ctx->saved_data["rank"] = static_cast<int64_t>(ring.rank);
    ctx->saved_data["size"] = static_cast<int64_t>(ring.size);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    AttentionMask local;
    local.query_positions = saved[5];
    local.query_segments = saved[6];
    const at::Tensor& all_segments = saved[7];
    Ring ring;
    ring.group = reinterpret_cast<ProcessGroup*>(ctx->saved_data["group"].toInt());
    ring.rank = static_cast<int>(ctx->saved_data["rank"].toInt());
    ring.size = static_cast<int>(ctx->saved_data["size"].toInt());
    const at::Tensor dout = grad_outputs[0];
    const at::ScalarType dtype = lse.scalar_type();
    const at::Tensor delta = (dout.to(dtype) * out.to(dtype)).sum(-1);
    at::Tensor block = at::stack({k, v}).contiguous();
    at::Tensor dq;
    // The key/value gradients of the block held, summed over the ranks it has visited; it
    // follows its block one hop behind, and after the last step one more hop takes each rank's
    // own home.
    at::Tensor grads;
    std::optional<Hop> grads_hop;
    for (int step = 0; step < ring.size; ++step) {
      std::optional<Hop> hop;
      if (step + 1 < ring.size) hop.emplace(ring, block, kKeysTag);
      const AttentionGrads g =
          attention_part_backward(q, block[0], block[1], dout, lse, delta,
                                  mask_against(local, all_segments, ring.source(step), ring.size));
      dq = step == 0 ? g.q : dq.add_(g.q);
      at::Tensor mine = at::stack({g.k, g.v});
      grads = grads_hop ? grads_hop->wait().add_(mine) : std::move(mine);
      grads_hop.emplace(ring, grads.contiguous(), kGradsTag);
      if (hop) block = hop->wait();
    }
    grads = grads_hop->wait();
    return {dq.to(q.scalar_type()), grads[0].to(k.scalar_type()), grads[1].to(v.scalar_type()),
            at::Tensor(), at::Tensor()};
  }
};

class RingSplit : public ContextSplit {
 public:
  explicit RingSplit(std::shared_ptr<ProcessGroup> group) : group_(std::move(group)) {}
  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }

  at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const AttentionMask& local, const at::Tensor& all_segments) const override {
    const Ring ring{group_.get(), rank(), size()};
    return RingAttentionFunction::apply(q, k, v, ring, RingMask{local, all_segments});
  }

  at::Tensor gather(const at::Tensor& x) const override {
    const at::Tensor input = x.contiguous();
    at::Tensor output = at::empty({size() * input.numel()}, input.options());
    group_->all_gather(input.reshape({-1}), output)->wait();
    std::vector<int64_t> shape = {size()};
    for (int64_t d : input.sizes()) shape.push_back(d);
    return output.view(shape);
  }

  double mean(double value) const override {
    at::Tensor t = at::tensor(value, at::kDouble);
    group_->all_reduce(t, ReduceOp::kAvg)->wait();
    return t.item<double>();
  }

 private:
  std::shared_ptr<ProcessGroup> group_;
};

}  // namespace

std::shared_ptr<ContextSplit> ring_split(std::shared_ptr<ProcessGroup> group) {
  return std::make_shared<RingSplit>(std::move(group));
}

}  // namespace shardtrain::detail
