// The per-parameter AdamW state LibTorch's AdamW keeps (step, exp_avg, exp_avg_sq), found or
// created the way torch::optim::AdamW does, for the optimizers built on its state.
#pragma once

#include <torch/optim/adamw.h>

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

inline void reject_amsgrad(const torch::optim::AdamWOptions& options, const char* optimizer) {
  if (options.amsgrad())
    throw std::invalid_argument(std::string(optimizer) + ": amsgrad is not supported");
}

}  // namespace shardtrain::detail
