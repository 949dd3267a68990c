#include <ATen/core/grad_mode.h>

#include "optim/adam_state.h"
#include "shardtrain/optimizers.h"

namespace shardtrain {

CompressedMomentumOptimizer::CompressedMomentumOptimizer(
    std::vector<torch::optim::OptimizerParamGroup> param_groups,
    torch::optim::AdamWOptions defaults, int64_t freeze_step, const char* name)
    : torch::optim::AdamW(std::move(param_groups), defaults), freeze_step_(freeze_step) {
  if (freeze_step_ < 0) {
    throw std::invalid_argument(std::string(name) + ": freeze_step must be >= 0, got " +
                                std::to_string(freeze_step_));
  }
  for (auto& group : param_groups_) {
    detail::reject_amsgrad(static_cast<torch::optim::AdamWOptions&>(group.options()), name);
  }
}

void CompressedMomentumOptimizer::mask_unseen(at::Tensor& exp_avg, const at::Tensor& exp_avg_sq) {
  exp_avg.mul_(exp_avg_sq.ne(0));
}

int64_t CompressedMomentumOptimizer::updates() const {
  for (const auto& group : param_groups_) {
    for (const auto& p : group.params()) {
      auto it = state_.find(detail::optimizer_state_key(p));
      if (it != state_.end())
        return static_cast<const torch::optim::AdamWParamState&>(*it->second).step();
    }
  }
  return 0;
}

OneBitAdam::OneBitAdam(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                       torch::optim::AdamWOptions defaults, int64_t freeze_step)
    : CompressedMomentumOptimizer(std::move(param_groups), defaults, freeze_step, "OneBitAdam") {}

at::Tensor OneBitAdam::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  const at::Tensor loss = detail::run_closure(closure);
  for (auto& group : param_groups_) {
    const auto& options = static_cast<torch::optim::AdamWOptions&>(group.options());
    const auto [beta1, beta2] = options.betas();
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const at::Tensor& grad = detail::dense_gradient(p, "OneBitAdam");
      auto& state = detail::adam_state_of(*this, p);
      state.step(state.step() + 1);
      at::Tensor& m = state.exp_avg();
      at::Tensor& v = state.exp_avg_sq();
      m.mul_(beta1).add_(grad, 1 - beta1);
      if (state.step() <= freeze_step_) {
        v.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
      } else {
        if (averaging()) {
          // The gradients were this rank's own: the momentum is averaged instead, compressed.
          at::Tensor flat = m.contiguous();
          compressed_all_reduce(*group_, flat, errors_[detail::optimizer_state_key(p)]);
          if (!flat.is_same(m)) m.copy_(flat);
        }
        mask_unseen(m, v);
      }
      p.add_(detail::decayed_direction(p, m, v, options), -options.lr());
    }
  }
  return loss;
}

}  // namespace shardtrain
