#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>

#include "optim/adam_state.h"
#include "shardtrain/optimizers.h"

namespace shardtrain {

Lamb::Lamb(std::vector<torch::optim::OptimizerParamGroup> param_groups,
           torch::optim::AdamWOptions defaults, LambOptions lamb)
    : torch::optim::AdamW(std::move(param_groups), defaults), lamb_(lamb) {
  if (!(lamb_.min_coeff > 0 && lamb_.min_coeff <= lamb_.max_coeff)) {
    throw std::invalid_argument("Lamb: min_coeff (" + std::to_string(lamb_.min_coeff) +
                                ") must be positive and at most max_coeff (" +
                                std::to_string(lamb_.max_coeff) + ")");
  }
  for (auto& group : param_groups_) {
    detail::reject_amsgrad(static_cast<torch::optim::AdamWOptions&>(group.options()), "Lamb");
  }
}

at::Tensor Lamb::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  const at::Tensor loss = detail::run_closure(closure);
  ratios_.clear();
  for (auto& group : param_groups_) {
    const auto& options = static_cast<torch::optim::AdamWOptions&>(group.options());
    const auto [beta1, beta2] = options.betas();
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const at::Tensor& grad = detail::dense_gradient(p, "Lamb");
      auto& state = detail::adam_state_of(*this, p);
      state.step(state.step() + 1);
      const auto t = static_cast<double>(state.step());
      const double step_size =
          lamb_.bias_correction
              ? options.lr() * std::sqrt(1 - std::pow(beta2, t)) / (1 - std::pow(beta1, t))
              : options.lr();
      at::Tensor& m = state.exp_avg();
      at::Tensor& v = state.exp_avg_sq();
      m.mul_(beta1).add_(grad, 1 - beta1);
      v.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
      const at::Tensor update = detail::decayed_direction(p, m, v, options);
      const double ratio = detail::trust_ratio(p, update, lamb_.min_coeff, lamb_.max_coeff);
      p.add_(update, -step_size * ratio);
      ratios_.push_back(ratio);
    }
  }
  return loss;
}

}  // namespace shardtrain
