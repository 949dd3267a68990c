// The mixture-of-experts feed-forward block: routing, the load-balancing loss, and dropless (or
// capacity-bounded) dispatch of tokens to the experts and back.
#include <torch/autograd.h>

#include <cmath>
#include <optional>

#include "model/checkpoint.h"
#include "model/layers.h"
#include "trace/telemetry.h"

namespace shardtrain::detail {
namespace {

// Returns `output` unchanged; in backward, `aux` gets the gradient `weight` as if `weight x aux`
// had been added to the loss (Megatron-LM's MoEAuxLossAutoScaler). The load-balancing loss so
// joins the gradient wherever the block runs (a pipeline stage, a recomputed block) without
// changing the loss the model returns.
class AttachAuxLoss : public torch::autograd::Function<AttachAuxLoss> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& output,
                            const at::Tensor& aux, double weight) {
    ctx->save_for_backward({aux});
    ctx->saved_data["weight"] = weight;
    return output;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor aux = ctx->get_saved_variables()[0];
    return {grads[0], at::full_like(aux, ctx->saved_data["weight"].toDouble()), at::Tensor()};
  }
};

at::ScalarType routing_dtype(const at::Tensor& logits) {
  return at::promote_types(logits.scalar_type(), at::kFloat);  // fp32, or double for double
}

}  // namespace

Routing route(const at::Tensor& logits, int64_t k, bool normalize) {
  Routing r;
  r.probs = at::softmax(logits.to(routing_dtype(logits)), -1);
  std::tie(r.weights, r.experts) = at::topk(r.probs, k, -1);
  if (normalize) r.weights = r.weights / r.weights.sum(-1, /*keepdim=*/true);
  return r;
}

at::Tensor load_balancing_loss(const at::Tensor& probs, const at::Tensor& experts) {
  const int64_t rows = probs.size(0), length = probs.size(1), n_experts = probs.size(2);
  const at::Tensor assigned =
      at::zeros({rows, n_experts}, probs.options())
          .scatter_add_(1, experts.reshape({rows, -1}),
                        at::ones(experts.reshape({rows, -1}).sizes(), probs.options()));
  const at::Tensor share = assigned / static_cast<double>(length);  // f_e, no gradient
  return (share * probs.mean(1)).sum(-1).mean() * static_cast<double>(n_experts);
}

MoeImpl::MoeImpl(const ModelConfig& config, int64_t layer, bool deferred, int64_t first_expert,
                 int64_t count)
    : layer_(layer),
      top_k_(config.experts_per_token),
      n_experts_(config.n_experts),
      first_expert_(first_expert),
      normalize_(config.norm_topk_prob),
      capacity_factor_(config.capacity_factor),
      aux_coef_(config.router_aux_loss_coef) {
  router = register_module("router", Linear(config.d_model, config.n_experts, false, deferred));
  experts = register_module("experts", torch::nn::ModuleDict());
  const int64_t held = count < 0 ? config.n_experts : count;
  for (int64_t e = first_expert; e < first_expert + held; ++e) {
    held_.push_back(LlamaMlp(config.d_model, config.ffn_hidden, deferred));
    experts->update({{std::to_string(e), held_.back().ptr()}});
  }
  if (config.n_shared_experts > 0) {
    shared = register_module(
        "shared", LlamaMlp(config.d_model, config.n_shared_experts * config.ffn_hidden, deferred));
  }
}

LlamaMlp& MoeImpl::expert(int64_t e) {
  TORCH_CHECK(e >= first_expert_ && e < first_expert_ + static_cast<int64_t>(held_.size()),
              "MoE layer ", layer_, " does not hold expert ", e);
  return held_[static_cast<size_t>(e - first_expert_)];
}

at::Tensor MoeImpl::run_experts(const at::Tensor& rows, const std::vector<int64_t>& counts) {
  std::vector<at::Tensor> outputs;
  outputs.reserve(held_.size());
  int64_t offset = 0;
  for (size_t i = 0; i < held_.size(); ++i) {
    outputs.push_back(held_[i]->forward(rows.narrow(0, offset, counts[i])));
    offset += counts[i];
  }
  return at::cat(outputs);
}

at::Tensor MoeImpl::forward(const at::Tensor& x, MoeState* state) {
  const int64_t d = x.size(-1);
  const at::Tensor flat = x.reshape({-1, d});
  const int64_t tokens = flat.size(0);
  // Forward's phases in a trace (category "moe"): routing, gathering each expert's rows and
  // sending them to the ranks that hold their experts; the experts; their outputs sent back and
  // added, weighted, into the tokens' rows.
  std::optional<TraceSpan> phase(std::in_place, "moe dispatch", "moe");
  const Routing r = route(router->forward(flat), top_k_, normalize_);

  // The token-to-expert assignments grouped by expert, each group in token order.
  const at::Tensor chosen = r.experts.reshape({-1});
  at::Tensor order = std::get<1>(at::sort(chosen, /*stable=*/true, 0, /*descending=*/false));
  const at::Tensor routed = at::bincount(chosen, {}, n_experts_);
  at::Tensor counts = routed;
  if (capacity_factor_ > 0.0) {
    // An expert keeps its first `capacity` assignments; the others skip it.
    const auto capacity = static_cast<int64_t>(
        std::ceil(capacity_factor_ * tokens * top_k_ / static_cast<double>(n_experts_)));
    const at::Tensor starts = counts.cumsum(0) - counts;
    const at::Tensor rank_in_expert =
        at::arange(order.numel(), order.options()) - starts.repeat_interleave(counts);
    order = order.masked_select(rank_in_expert < capacity);
    counts = counts.clamp_max(capacity);
  }
  const at::Tensor token = order.div(top_k_, "floor");
  const at::Tensor weight = r.weights.reshape({-1}).index_select(0, order).to(x.scalar_type());
  const at::Tensor rows = flat.index_select(0, token);
  const at::Tensor per_expert = counts.to(at::kCPU).contiguous();
  const std::vector<int64_t> sizes(per_expert.data_ptr<int64_t>(),
                                   per_expert.data_ptr<int64_t>() + n_experts_);

  at::Tensor expert_out;
  if (state && state->split) {
    const ExpertSplit::Received received = state->split->dispatch(rows, sizes);
    phase.emplace("moe experts", "moe");
    const at::Tensor computed = run_experts(received.rows, received.counts);
    phase.emplace("moe combine", "moe");
    expert_out = state->split->combine(computed, received);
  } else {
    TORCH_CHECK(static_cast<int64_t>(held_.size()) == n_experts_, "MoE layer ", layer_, " holds ",
                held_.size(), " of ", n_experts_,
                " experts but has no expert split to reach the others");
    phase.emplace("moe experts", "moe");
    expert_out = run_experts(rows, sizes);
    phase.emplace("moe combine", "moe");
  }
  const at::Tensor combined = expert_out * weight.unsqueeze(1);
  at::Tensor out = at::zeros_like(flat).index_add(0, token, combined);
  if (shared) out = out + shared->forward(flat);
  out = out.view(x.sizes());
  phase.reset();

  if (!is_training() || !state || x.dim() != 3) return out;
  const at::Tensor probs = r.probs.view({x.size(0), x.size(1), n_experts_});
  const at::Tensor aux = load_balancing_loss(probs, r.experts.view({x.size(0), x.size(1), -1}));
  if (!recomputing()) {
    state->tokens[layer_] += routed.to(at::kCPU);
    state->aux_sum += aux.item<double>();
    ++state->aux_count;
  }
  if (aux_coef_ > 0.0 && at::GradMode::is_enabled() && aux.requires_grad()) {
    out = AttachAuxLoss::apply(out, aux, aux_coef_ * state->aux_weight);
  }
  return out;
}

}  // namespace shardtrain::detail
