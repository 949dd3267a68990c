#include "shardtrain/ddp.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <set>
#include <sstream>

#include "model/checkpoint.h"
#include "parallel/grad_hook.h"

namespace shardtrain {

// One flat buffer per bucket; its parameters' gradients are views into it.
struct DistributedDataParallel::Bucket {
  std::vector<size_t> params;  // indices, in the order they are laid out
  at::Tensor buffer;           // flat gradients
  at::Tensor wire;             // 16-bit copy sent instead, with a compression hook
  size_t pending = 0;          // parameters whose gradient is not ready yet
  WorkHandle work;
  double launched = 0;
};

namespace {

double seconds_between(std::chrono::steady_clock::time_point from,
                       std::chrono::steady_clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

double DDPTimeline::hidden_fraction() const {
  double total = 0, hidden = 0;
  for (const auto& b : buckets) {
    total += b.end - b.start;
    hidden += std::max(0.0, std::min(b.end, last_gradient) - b.start);
  }
  return total > 0 ? hidden / total : 0.0;
}

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 std::shared_ptr<ProcessGroup> group,
                                                 DDPOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(options) {
  TORCH_CHECK(module_ && group_, "DistributedDataParallel: module and group are required");
  TORCH_CHECK(options_.bucket_cap_mb_ > 0 && options_.first_bucket_cap_mb_ > 0,
              "DistributedDataParallel: bucket caps must be positive");
  const std::set<std::string> ignored(options_.ignore_.begin(), options_.ignore_.end());
  // Every replica starts from rank 0's state.
  {
    torch::NoGradGuard no_grad;
    std::vector<WorkHandle> pending;
    for (const auto& item : module_->named_parameters()) {
      if (!ignored.count(item.key())) pending.push_back(group_->broadcast(item.value().data(), 0));
    }
    for (auto& b : module_->buffers()) pending.push_back(group_->broadcast(b, 0));
    for (auto& w : pending) w->wait();
  }
  for (const auto& item : module_->named_parameters()) {
    if (!item.value().requires_grad() || ignored.count(item.key())) continue;
    names_.push_back(item.key());
    params_.push_back(item.value());
  }
  TORCH_CHECK(!params_.empty(), "DistributedDataParallel: the module has no trainable parameters");

  // Reverse registration order approximates the order backward produces gradients, so the
  // first bucket is complete first. As in PyTorch, a bucket is closed by the parameter that
  // brings it to its cap, so a weight and the bias before it stay together. A bucket holds one
  // dtype: a change of dtype closes it early.
  bucket_of_.assign(params_.size(), 0);
  offset_of_.assign(params_.size(), 0);
  std::vector<std::vector<size_t>> layout;
  int64_t bucket_bytes = 0;
  bool open = false;  // whether layout.back() takes more parameters
  for (size_t k = params_.size(); k-- > 0;) {
    const at::Tensor& p = params_[k];
    if (open && params_[layout.back().front()].scalar_type() != p.scalar_type()) open = false;
    if (!open) {
      layout.emplace_back();
      bucket_bytes = 0;
      open = true;
    }
    layout.back().push_back(k);
    bucket_bytes += static_cast<int64_t>(p.nbytes());
    const double cap_mb =
        layout.size() == 1 ? options_.first_bucket_cap_mb_ : options_.bucket_cap_mb_;
    if (bucket_bytes >= static_cast<int64_t>(cap_mb * (1 << 20))) open = false;
  }
  for (size_t b = 0; b < layout.size(); ++b) {
    auto bucket = std::make_unique<Bucket>();
    bucket->params = layout[b];
    int64_t numel = 0;
    for (size_t k : bucket->params) {
      bucket_of_[k] = b;
      offset_of_[k] = numel;
      numel += params_[k].numel();
    }
    const at::Tensor& first = params_[bucket->params.front()];
    bucket->buffer = at::zeros({numel}, first.options().requires_grad(false));
    buckets_.push_back(std::move(bucket));
    for (size_t k : buckets_.back()->params) {
      at::Tensor view = grad_view(k);
      if (params_[k].grad().defined()) view.copy_(params_[k].grad());
      params_[k].mutable_grad() = view;  // backward accumulates straight into the bucket
    }
  }

  // A hook after each parameter's gradient accumulation marks it ready.
  for (size_t k = 0; k < params_.size(); ++k) {
    hooks_.emplace_back(params_[k], [this, k] { mark_ready(k); });
  }
  ready_.assign(params_.size(), false);
  reset_for_next_backward();
}

DistributedDataParallel::~DistributedDataParallel() {
  for (auto& bucket : buckets_) {
    if (bucket->work) {
      try {
        bucket->work->wait();
      } catch (const std::exception&) {
        // the group failed; nothing to hand back from a destructor
      }
    }
  }
}

std::vector<std::vector<std::string>> DistributedDataParallel::bucket_layout() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& bucket : buckets_) {
    out.emplace_back();
    for (size_t k : bucket->params) out.back().push_back(names_[k]);
  }
  return out;
}

at::Tensor DistributedDataParallel::grad_view(size_t k) const {
  // An alias of the bucket's storage rather than an autograd view (narrow/view): optimizers'
  // zero_grad() call detach_() on gradients, which autograd refuses for views.
  const Bucket& bucket = *buckets_[bucket_of_[k]];
  at::Tensor alias = at::empty({0}, bucket.buffer.options());
  alias.set_(bucket.buffer.storage(), bucket.buffer.storage_offset() + offset_of_[k],
             params_[k].sizes());  // contiguous strides: the bucket slot is dense
  return alias;
}

void DistributedDataParallel::reset_for_next_backward() {
  for (auto& bucket : buckets_) {
    bucket->pending = bucket->params.size();
    bucket->work.reset();
  }
  std::fill(ready_.begin(), ready_.end(), false);
  next_to_launch_ = 0;
  in_backward_ = false;
}

void DistributedDataParallel::mark_ready(size_t k) {
  if (!sync_) return;
  if (!in_backward_) {
    in_backward_ = true;
    backward_start_ = std::chrono::steady_clock::now();
    timeline_ = DDPTimeline();
    // Runs when the autograd engine has finished this backward pass.
    detail::queue_backward_callback([this] { finish_backward(); });
  }
  if (ready_[k]) return;  // a parameter used twice: its accumulator fires again
  ready_[k] = true;
  adopt_gradient(k);
  Bucket& bucket = *buckets_[bucket_of_[k]];
  if (--bucket.pending == 0) {
    // Buckets go out strictly in order, so every rank issues the same sequence of collectives
    // even when gradients become ready in different orders.
    while (next_to_launch_ < buckets_.size() && buckets_[next_to_launch_]->pending == 0) {
      launch(next_to_launch_++);
    }
  }
}

void DistributedDataParallel::adopt_gradient(size_t k) {
  const at::Tensor& p = params_[k];
  const Bucket& bucket = *buckets_[bucket_of_[k]];
  // A gradient that is not our view (set to None by zero_grad, then stolen by the accumulator)
  // is copied into the bucket, and the view restored. Comparing addresses keeps this check off
  // the allocator on the usual path.
  const void* slot =
      static_cast<char*>(bucket.buffer.data_ptr()) + offset_of_[k] * bucket.buffer.element_size();
  if (!p.grad().defined() || p.grad().data_ptr() != slot) {
    const at::Tensor view = grad_view(k);
    if (p.grad().defined()) {
      view.copy_(p.grad());
    } else {
      view.zero_();
    }
    params_[k].mutable_grad() = view;
  }
}

void DistributedDataParallel::all_reduce_gradients() {
  TORCH_CHECK(!in_backward_, "DistributedDataParallel::all_reduce_gradients during a backward");
  for (size_t k = 0; k < params_.size(); ++k) adopt_gradient(k);
  backward_start_ = std::chrono::steady_clock::now();
  timeline_ = DDPTimeline();
  for (size_t b = 0; b < buckets_.size(); ++b) launch(b);
  for (auto& bucket : buckets_) {
    bucket->work->wait();
    if (bucket->wire.defined()) {
      bucket->buffer.copy_(bucket->wire);
      bucket->wire = at::Tensor();
    }
  }
  reset_for_next_backward();
}

void DistributedDataParallel::launch(size_t b) {
  Bucket& bucket = *buckets_[b];
  bucket.launched = seconds_between(backward_start_, std::chrono::steady_clock::now());
  switch (options_.comm_hook_) {
    case DDPCommHook::kNone:
      bucket.work = group_->all_reduce(bucket.buffer, ReduceOp::kAvg);
      break;
    case DDPCommHook::kBf16Compress:
    case DDPCommHook::kFp16Compress:
      bucket.wire = bucket.buffer.to(
          options_.comm_hook_ == DDPCommHook::kBf16Compress ? at::kBFloat16 : at::kHalf);
      bucket.work = group_->all_reduce(bucket.wire, ReduceOp::kAvg);
      break;
  }
}

void DistributedDataParallel::finish_backward() {
  const auto last_gradient = std::chrono::steady_clock::now();
  std::vector<std::string> missing;
  for (size_t k = 0; k < params_.size(); ++k) {
    if (!ready_[k]) missing.push_back(names_[k]);
  }
  if (!missing.empty()) {
    if (!options_.find_unused_parameters_) {
      // Wait for what was launched, so the group stays consistent, then refuse.
      for (auto& bucket : buckets_) {
        if (bucket->work) bucket->work->wait();
      }
      std::ostringstream message;
      message << "DistributedDataParallel: " << missing.size()
              << " parameter(s) received no gradient in this backward pass (";
      for (size_t i = 0; i < missing.size() && i < 5; ++i) message << (i ? ", " : "") << missing[i];
      message << (missing.size() > 5 ? ", ..." : "")
              << "); if they are unused by design, construct DDP with "
                 "DDPOptions().find_unused_parameters(true)";
      reset_for_next_backward();
      throw std::runtime_error(message.str());
    }
    // Unused parameters contribute their current gradient (zero after zero_grad); marking them
    // ready launches the remaining buckets in order.
    for (size_t k = 0; k < params_.size(); ++k) {
      if (!ready_[k]) mark_ready(k);
    }
  }
  timeline_.last_gradient = seconds_between(backward_start_, last_gradient);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = *buckets_[b];
    bucket.work->wait();
    if (bucket.wire.defined()) {
      bucket.buffer.copy_(bucket.wire);
      bucket.wire = at::Tensor();
    }
    // From backends that cannot tell when an operation ran, a bucket is recorded as starting at
    // its launch, with no duration.
    const auto since_backward = [&](std::chrono::steady_clock::time_point t, double otherwise) {
      return t.time_since_epoch().count() ? seconds_between(backward_start_, t) : otherwise;
    };
    const double start = since_backward(bucket.work->started_at(), bucket.launched);
    timeline_.buckets.push_back(DDPTimeline::Bucket{
        static_cast<int>(b), static_cast<int64_t>(bucket.buffer.nbytes()), bucket.launched, start,
        std::max(start, since_backward(bucket.work->finished_at(), start))});
  }
  timeline_.finished = seconds_between(backward_start_, std::chrono::steady_clock::now());
  reset_for_next_backward();
}

}  // namespace shardtrain
