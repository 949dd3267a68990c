#include "shardtrain/fused_adamw.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <stdexcept>

#include "optim/adam_state.h"
#include "optim/adamw_kernel.h"
#include "optim/state_key.h"

namespace shardtrain {
namespace {

// Threads take contiguous ranges of at least this many elements: below it the cost of waking
// a thread exceeds the update.
constexpr int64_t kGrain = int64_t{1} << 15;

void check_fp32(const at::Tensor& t, const char* name, int64_t numel) {
  if (!t.defined())
    throw std::invalid_argument(std::string("fused AdamW: ") + name + " is undefined");
  if (!t.device().is_cpu()) {
    throw std::invalid_argument(std::string("fused AdamW: ") + name + " is on " + t.device().str() +
                                ", expected the CPU");
  }
  if (t.scalar_type() != at::kFloat) {
    throw std::invalid_argument(std::string("fused AdamW: ") + name + " is " +
                                c10::toString(t.scalar_type()) + ", expected Float");
  }
  if (t.layout() != at::kStrided || !t.is_contiguous()) {
    throw std::invalid_argument(std::string("fused AdamW: ") + name + " is not contiguous");
  }
  if (t.numel() != numel) {
    throw std::invalid_argument(std::string("fused AdamW: ") + name + " has " +
                                std::to_string(t.numel()) + " elements, param has " +
                                std::to_string(numel));
  }
}

void check_hyper(const AdamWStep& h) {
  auto bad = [](const std::string& what) { throw std::invalid_argument("fused AdamW: " + what); };
  if (h.step_ < 1) bad("step is " + std::to_string(h.step_) + ", expected >= 1 (1-based)");
  if (!(h.beta1_ >= 0 && h.beta1_ < 1))
    bad("beta1 is " + std::to_string(h.beta1_) + ", expected [0, 1)");
  if (!(h.beta2_ >= 0 && h.beta2_ < 1))
    bad("beta2 is " + std::to_string(h.beta2_) + ", expected [0, 1)");
  if (!(h.lr_ >= 0)) bad("lr is " + std::to_string(h.lr_) + ", expected >= 0");
  if (!(h.eps_ >= 0)) bad("eps is " + std::to_string(h.eps_) + ", expected >= 0");
  if (!(h.weight_decay_ >= 0))
    bad("weight_decay is " + std::to_string(h.weight_decay_) + ", expected >= 0");
}

void reject_amsgrad(const torch::optim::AdamWOptions& options) {
  if (options.amsgrad()) {
    throw std::invalid_argument("FusedAdamW: amsgrad is not supported (use torch::optim::AdamW)");
  }
}

bool fusable(const at::Tensor& p, const at::Tensor& grad) {
  return p.device().is_cpu() && p.scalar_type() == at::kFloat && p.is_contiguous() &&
         grad.device().is_cpu() && grad.scalar_type() == at::kFloat &&
         grad.layout() == at::kStrided && grad.is_contiguous() && grad.numel() == p.numel();
}

// LibTorch 1.13's AdamW::step body for one parameter, for tensors the kernel does not take.
void unfused_update(at::Tensor& p, const at::Tensor& grad, at::Tensor& exp_avg,
                    at::Tensor& exp_avg_sq, const AdamWStep& h) {
  if (h.weight_decay_ != 0) p.mul_(1 - h.lr_ * h.weight_decay_);
  const double bias_correction1 =
      h.bias_correction_ ? 1 - std::pow(h.beta1_, static_cast<double>(h.step_)) : 1.0;
  const double bias_correction2 =
      h.bias_correction_ ? 1 - std::pow(h.beta2_, static_cast<double>(h.step_)) : 1.0;
  exp_avg.mul_(h.beta1_).add_(grad, 1 - h.beta1_);
  exp_avg_sq.mul_(h.beta2_).addcmul_(grad, grad, 1 - h.beta2_);
  const auto denom = (exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(h.eps_);
  p.addcdiv_(exp_avg, denom, -(h.lr_ / bias_correction1));
}

}  // namespace

namespace detail {

void adamw_parallel(const AdamWScalars& s, float* param, const float* grad, float* exp_avg,
                    float* exp_avg_sq, uint16_t* bf16, int64_t n) {
  const AdamIsa isa = adam_isa();
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    adamw_range(isa, s, param + begin, grad + begin, exp_avg + begin, exp_avg_sq + begin,
                bf16 ? bf16 + begin : nullptr, end - begin);
  });
}

uint16_t* check_adamw_args(const at::Tensor& param, const at::Tensor& grad,
                           const at::Tensor* exp_avg, const at::Tensor* exp_avg_sq,
                           const AdamWStep& hyper, const at::Tensor* param_bf16_out) {
  check_fp32(param, "param", param.defined() ? param.numel() : 0);
  check_fp32(grad, "grad", param.numel());
  if (exp_avg) check_fp32(*exp_avg, "exp_avg", param.numel());
  if (exp_avg_sq) check_fp32(*exp_avg_sq, "exp_avg_sq", param.numel());
  check_hyper(hyper);
  if (!param_bf16_out) return nullptr;
  const at::Tensor& out = *param_bf16_out;
  if (!out.defined() || !out.device().is_cpu() || out.scalar_type() != at::kBFloat16 ||
      !out.is_contiguous() || out.numel() != param.numel()) {
    throw std::invalid_argument(
        "fused AdamW: param_bf16_out must be a contiguous CPU BFloat16 tensor of " +
        std::to_string(param.numel()) + " elements");
  }
  return reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
}

}  // namespace detail

AdamWStep AdamWStep::from(const torch::optim::AdamWOptions& options, int64_t step) {
  reject_amsgrad(options);
  return AdamWStep()
      .lr(options.lr())
      .betas(std::get<0>(options.betas()), std::get<1>(options.betas()))
      .eps(options.eps())
      .weight_decay(options.weight_decay())
      .step(step);
}

void fused_adamw_step(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                      const at::Tensor& exp_avg_sq, const AdamWStep& hyper,
                      const at::Tensor* param_bf16_out) {
  uint16_t* bf16 =
      detail::check_adamw_args(param, grad, &exp_avg, &exp_avg_sq, hyper, param_bf16_out);
  detail::adamw_parallel(detail::AdamWScalars::from(hyper), param.data_ptr<float>(),
                         grad.data_ptr<float>(), exp_avg.data_ptr<float>(),
                         exp_avg_sq.data_ptr<float>(), bf16, param.numel());
}

std::string fused_adamw_isa() { return detail::adam_isa_name(detail::adam_isa()); }

FusedAdamW::FusedAdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                       torch::optim::AdamWOptions defaults)
    : torch::optim::AdamW(std::move(param_groups), defaults) {
  for (auto& group : param_groups_) {
    reject_amsgrad(static_cast<torch::optim::AdamWOptions&>(group.options()));
  }
}

FusedAdamW::FusedAdamW(std::vector<at::Tensor> params, torch::optim::AdamWOptions defaults)
    : FusedAdamW({torch::optim::OptimizerParamGroup(std::move(params))}, defaults) {}

at::Tensor FusedAdamW::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  const at::Tensor loss = detail::run_closure(closure);
  for (auto& group : param_groups_) {
    auto& options = static_cast<torch::optim::AdamWOptions&>(group.options());
    reject_amsgrad(options);
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const auto& grad = detail::dense_gradient(p, "FusedAdamW");
      // The same key and lazily created state as torch::optim::AdamW, so both read each other's.
      auto& state = detail::adam_state_of(*this, p);
      state.step(state.step() + 1);
      const AdamWStep hyper =
          AdamWStep::from(options, state.step()).bias_correction(bias_correction_);
      at::Tensor param = p;
      if (fusable(p, grad) && state.exp_avg().is_contiguous() &&
          state.exp_avg_sq().is_contiguous()) {
        fused_adamw_step(param, grad, state.exp_avg(), state.exp_avg_sq(), hyper);
        // What an in-place tensor op would do: autograd sees that the parameter changed.
        p.unsafeGetTensorImpl()->bump_version();
      } else {
        unfused_update(param, grad, state.exp_avg(), state.exp_avg_sq(), hyper);
      }
    }
  }
  return loss;
}

}  // namespace shardtrain
