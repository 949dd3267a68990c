#include "model/chunked_loss.h"

#include <torch/autograd.h>

#include <algorithm>
#include <utility>

namespace shardtrain::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct HeadLoss {
  at::Tensor loss;         // scalar, fp32
  at::Tensor grad_hidden;  // d loss / d hidden, or undefined
  at::Tensor grad_weight;  // d loss / d weight (fp32), or undefined
};

// The loss, and the gradients asked for, chunk by chunk.
HeadLoss compute(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                 double divisor, int64_t chunk, const LayerSplit* split, bool want_hidden,
                 bool want_weight, const WeightGradientSink* sink = nullptr) {
  const int64_t n = hidden.size(0);
  const int64_t local = weight.size(0);
  const int64_t first = split ? static_cast<int64_t>(split->rank()) * local : 0;
  VocabularyReductions reduce;
  if (split) {
    reduce.max = [split](at::Tensor& x) { split->max_across(x); };
    reduce.sum = [split](at::Tensor& x) { split->sum_across(x); };
  }
  const at::Tensor kept = (targets != kIgnoreIndex).to(at::kFloat);
  // The mean over the kept tokens when no divisor is given (0 kept: NaN, as cross_entropy).
  const at::Tensor scale =
      divisor > 0 ? at::scalar_tensor(1.0 / divisor, at::kFloat) : kept.sum().reciprocal();
  HeadLoss out;
  at::Tensor total = at::zeros({}, hidden.options().dtype(at::kFloat));
  if (want_hidden) out.grad_hidden = at::empty_like(hidden);
  if (want_weight && sink && sink->buffer) out.grad_weight = sink->buffer();
  if (want_weight && !out.grad_weight.defined()) {
    out.grad_weight = at::zeros(weight.sizes(), weight.options().dtype(at::kFloat));
  }
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t rows = std::min(chunk, n - start);
    const at::Tensor h = hidden.narrow(0, start, rows);
    const at::Tensor z = at::linear(h, weight);  // [rows, local], the matmul's dtype
    at::Tensor p = z.to(at::kFloat);             // becomes the softmax, then its gradient, in place
    const SoftmaxRows s = softmax_rows(p, targets.narrow(0, start, rows), first, reduce);
    const at::Tensor k = kept.narrow(0, start, rows);
    total.add_((s.per_token * k).sum());
    if (!want_hidden && !want_weight) continue;
    // d loss / d z = (softmax - [v == target]) x kept x scale, in the matmul's dtype as the
    // unchunked graph has it.
    p.div_(s.sum_exp.unsqueeze(1));
    p.scatter_add_(1, s.index, -s.mine.unsqueeze(1));
    p.mul_((k * scale).unsqueeze(1));
    const at::Tensor dz = p.to(z.scalar_type());
    if (want_hidden) {
      out.grad_hidden.narrow(0, start, rows).copy_(at::mm(dz, weight.to(dz.scalar_type())));
    }
    if (want_weight) out.grad_weight.add_(at::mm(dz.t(), h.to(dz.scalar_type())));
  }
  out.loss = total * scale;
  return out;
}

class ChunkedHeadLoss : public torch::autograd::Function<ChunkedHeadLoss> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden,
                            const at::Tensor& weight, const at::Tensor& targets, double divisor,
                            int64_t chunk, int64_t split_handle, int64_t sink_handle) {
    const auto* split = reinterpret_cast<const LayerSplit*>(split_handle);
    HeadLoss result =
        compute(hidden, weight, targets, divisor, chunk, split, hidden.requires_grad(),
                weight.requires_grad(), reinterpret_cast<const WeightGradientSink*>(sink_handle));
    ctx->saved_data["grad_hidden"] = result.grad_hidden;
    ctx->saved_data["grad_weight"] = result.grad_weight;
    ctx->saved_data["sink"] = sink_handle;
    return result.loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor scale = grads[0];
    auto take = [&](const char* key) {
      at::Tensor grad = ctx->saved_data[key].toTensor();
      ctx->saved_data[key] = at::Tensor();  // freed as soon as it is handed on
      return grad;
    };
    at::Tensor grad_hidden = take("grad_hidden");
    at::Tensor grad_weight = take("grad_weight");
    TORCH_CHECK(grad_hidden.defined() || grad_weight.defined(),
                "chunked_head_loss: backward through the same graph a second time");
    if (grad_hidden.defined()) grad_hidden.mul_(scale);
    if (grad_weight.defined()) grad_weight.mul_(scale);
    const auto* sink = reinterpret_cast<const WeightGradientSink*>(ctx->saved_data["sink"].toInt());
    if (sink) {
      if (grad_weight.defined()) sink->take(grad_weight);
      grad_weight = at::Tensor();
    }
    return {grad_hidden,  grad_weight,  at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

SoftmaxRows softmax_rows(at::Tensor& p, const at::Tensor& targets, int64_t first,
                         const VocabularyReductions& reduce) {
  const int64_t rows = p.size(0), local = p.size(1);
  at::Tensor max = std::get<0>(p.max(1));
  if (reduce.max) reduce.max(max);
  p.sub_(max.unsqueeze(1));
  SoftmaxRows out;
  out.mine = ((targets >= first) & (targets < first + local)).to(p.scalar_type());
  out.index = (targets - first).clamp(0, local - 1).unsqueeze(1);
  const at::Tensor target_logit = p.gather(1, out.index).squeeze(1) * out.mine;
  p.exp_();
  at::Tensor sums = at::cat({p.sum(1), target_logit});  // one reduction for both
  if (reduce.sum) reduce.sum(sums);
  out.sum_exp = sums.narrow(0, 0, rows);
  out.per_token = out.sum_exp.log() - sums.narrow(0, rows, rows);
  return out;
}

at::Tensor chunked_head_loss(const at::Tensor& hidden, const at::Tensor& weight,
                             const at::Tensor& targets, double divisor, int64_t chunk,
                             const LayerSplit* split, const WeightGradientSink* weight_sink) {
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && targets.dim() == 1 &&
                  hidden.size(0) == targets.size(0) && hidden.size(1) == weight.size(1),
              "chunked_head_loss: expected hidden [N, D], weight [V, D] and targets [N], got ",
              hidden.sizes(), ", ", weight.sizes(), " and ", targets.sizes());
  TORCH_CHECK(chunk >= 1, "chunked_head_loss: chunk must be at least 1 token, got ", chunk);
  const bool grads =
      at::GradMode::is_enabled() && (hidden.requires_grad() || weight.requires_grad());
  if (!grads) {
    return compute(hidden, weight, targets, divisor, chunk, split, false, false).loss;
  }
  return ChunkedHeadLoss::apply(hidden, weight, targets, divisor, chunk,
                                reinterpret_cast<int64_t>(split),
                                reinterpret_cast<int64_t>(weight_sink));
}

int64_t loss_chunk_tokens(int64_t vocab, int64_t bytes) {
  return std::max<int64_t>(1, bytes / (4 * std::max<int64_t>(1, vocab)));
}

}  // namespace shardtrain::detail
