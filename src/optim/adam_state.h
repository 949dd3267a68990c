// The per-parameter AdamW state LibTorch's AdamW keeps (step, exp_avg, exp_avg_sq), found or
// created the way torch::optim::AdamW does, for the optimizers built on its state.
#pragma once

#include <ATen/core/grad_mode.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <memory>
#include <stdexcept>

#include "optim/state_key.h"

namespace shardtrain::detail {

// `p`'s state in `optimizer`, zeros (step 0) the first time.
inline torch::optim::AdamWParamState& adam_state_of(torch::optim::Optimizer& optimizer,
                                                    const at::Tensor& p) {
  auto& state = optimizer.state();
  const auto key = optimizer_state_key(p);
  auto it = state.find(key);
  if (it == state.end()) {
    auto fresh = std::make_unique<torch::optim::AdamWParamState>();
    fresh->step(0);
    fresh->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
    fresh->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
    it = state.emplace(key, std::move(fresh)).first;
  }
  return static_cast<torch::optim::AdamWParamState&>(*it->second);
}

// `p`'s gradient, refusing what these optimizers do not take.
inline const at::Tensor& dense_gradient(const at::Tensor& p, const char* optimizer) {
  const at::Tensor& grad = p.grad();
  if (grad.is_sparse())
    throw std::invalid_argument(std::string(optimizer) + ": sparse gradients are not supported");
  return grad;
}

// What torch::optim's optimizers do with a step's closure: run it with gradients enabled and
// return its loss (undefined without one).
inline at::Tensor run_closure(const torch::optim::Optimizer::LossClosure& closure) {
  if (closure == nullptr) return {};
  at::AutoGradMode enable_grad(true);
  return closure();
}

// Adam's step direction without bias corrections, with decoupled weight decay:
// m / (sqrt(v) + eps) + weight_decay * p (the direction LAMB scales, and 1-bit Adam takes).
inline at::Tensor decayed_direction(const at::Tensor& p, const at::Tensor& m, const at::Tensor& v,
                                    const torch::optim::AdamWOptions& options) {
  at::Tensor update = m / v.sqrt().add_(options.eps());
  if (options.weight_decay() != 0) update.add_(p, options.weight_decay());
  return update;
}

// LAMB's trust ratio ||p|| / ||update|| clamped to [min_coeff, max_coeff], 1 when either norm is
// 0 (norms in double: one number per tensor, whatever its dtype).
inline double trust_ratio(const at::Tensor& p, const at::Tensor& update, double min_coeff,
                          double max_coeff) {
  const double weight_norm = p.norm().item<double>();
  const double update_norm = update.norm().item<double>();
  if (weight_norm == 0 || update_norm == 0) return 1.0;
  return std::clamp(weight_norm / update_norm, min_coeff, max_coeff);
}

inline void reject_amsgrad(const torch::optim::AdamWOptions& options, const char* optimizer) {
  if (options.amsgrad())
    throw std::invalid_argument(std::string(optimizer) + ": amsgrad is not supported");
}

}  // namespace shardtrain::detail
