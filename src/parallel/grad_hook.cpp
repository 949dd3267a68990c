#include "parallel/grad_hook.h"

#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include <algorithm>

namespace shardtrain::detail {

GradAccumulatedHook::GradAccumulatedHook(const at::Tensor& param, std::function<void()> callback)
    : accumulator_(torch::autograd::impl::grad_accumulator(param)) {
  accumulator_->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
      [callback = std::move(callback)](const torch::autograd::variable_list& outputs,
                                       const torch::autograd::variable_list&) {
        callback();
        return outputs;
      }));
  hook_ = accumulator_->post_hooks().back().get();
}

GradAccumulatedHook::GradAccumulatedHook(GradAccumulatedHook&& other) noexcept
    : accumulator_(std::move(other.accumulator_)), hook_(other.hook_) {
  other.hook_ = nullptr;
}

GradAccumulatedHook::~GradAccumulatedHook() {
  if (!accumulator_) return;
  auto& hooks = accumulator_->post_hooks();
  hooks.erase(std::remove_if(hooks.begin(), hooks.end(),
                             [this](const auto& h) { return h.get() == hook_; }),
              hooks.end());
}

}  // namespace shardtrain::detail
