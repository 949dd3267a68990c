#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>

#include "optim/adam_state.h"
#include "shardtrain/optimizers.h"

namespace shardtrain {
namespace {

void check_options(const OneBitLambOptions& o) {
  auto require = [](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("OneBitLamb: " + what);
  };
  require(o.min_coeff > 0 && o.min_coeff <= o.max_coeff,
          "min_coeff must be positive and at most max_coeff");
  require(o.coeff_beta >= 0 && o.coeff_beta < 1, "coeff_beta must be in [0, 1)");
  require(o.factor_min > 0 && o.factor_min <= o.factor_max,
          "factor_min must be positive and at most factor_max");
  require(o.factor_threshold >= 0, "factor_threshold must be >= 0");
}

double rms(const at::Tensor& t) {
  return t.norm().item<double>() / std::sqrt(static_cast<double>(std::max<int64_t>(t.numel(), 1)));
}

}  // namespace

OneBitLamb::OneBitLamb(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                       torch::optim::AdamWOptions defaults, OneBitLambOptions options)
    : CompressedMomentumOptimizer(std::move(param_groups), defaults, options.freeze_step,
                                  "OneBitLamb"),
      options_(options) {
  check_options(options_);
}

OneBitLamb::Frozen& OneBitLamb::frozen_of(const at::Tensor& param) const {
  const auto key = detail::optimizer_state_key(param);
  auto it = frozen_.find(key);
  if (it == frozen_.end()) {
    const auto scalar = [](double value) { return at::scalar_tensor(value, at::kDouble); };
    Frozen fresh{at::zeros_like(param, at::MemoryFormat::Contiguous), scalar(0.0), scalar(1.0),
                 scalar(0.0)};
    it = frozen_.emplace(key, std::move(fresh)).first;
  }
  return it->second;
}

std::vector<std::pair<std::string, at::Tensor>> OneBitLamb::extra_state(
    const at::Tensor& param) const {
  if (!state_.count(detail::optimizer_state_key(param))) return {};
  Frozen& f = frozen_of(param);
  return {{"exp_avg_sq_fresh", f.exp_avg_sq_fresh},
          {"lamb_coeff", f.coeff},
          {"last_factor", f.last_factor},
          {"scaling", f.scaling}};
}

at::Tensor OneBitLamb::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  const at::Tensor loss = detail::run_closure(closure);
  coefficients_.clear();
  if (compressing()) {
    compressed_step();
  } else {
    warmup_step();
  }
  return loss;
}

void OneBitLamb::warmup_step() {
  for (auto& group : param_groups_) {
    const auto& options = static_cast<torch::optim::AdamWOptions&>(group.options());
    const auto [beta1, beta2] = options.betas();
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const at::Tensor& grad = detail::dense_gradient(p, "OneBitLamb");
      auto& state = detail::adam_state_of(*this, p);
      Frozen& frozen = frozen_of(p);
      state.step(state.step() + 1);
      at::Tensor& m = state.exp_avg();
      at::Tensor& v = state.exp_avg_sq();
      m.mul_(beta1).add_(grad, 1 - beta1);
      v.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
      if (state.step() == freeze_step_) frozen.exp_avg_sq_fresh.copy_(v);
      const at::Tensor update = detail::decayed_direction(p, m, v, options);
      const double ratio = detail::trust_ratio(p, update, options_.min_coeff, options_.max_coeff);
      // The ratio frozen for after the warmup: an average of those that were not 1.
      if (ratio != 1.0) {
        frozen.coeff.fill_(options_.coeff_beta * frozen.coeff.item<double>() +
                           (1 - options_.coeff_beta) * ratio);
      }
      p.add_(update, -options.lr() * ratio);
      coefficients_.push_back(ratio);
    }
  }
}

void OneBitLamb::compressed_step() {
  struct Entry {
    at::Tensor p;
    const torch::optim::AdamWOptions* options;
    torch::optim::AdamWParamState* state;
    Frozen* frozen;
    at::Tensor before;  // the momentum before this step
  };
  std::vector<Entry> entries;
  for (auto& group : param_groups_) {
    const auto* options = &static_cast<torch::optim::AdamWOptions&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      detail::dense_gradient(p, "OneBitLamb");
      entries.push_back({p, options, &detail::adam_state_of(*this, p), &frozen_of(p), {}});
    }
  }
  if (entries.empty()) return;
  // Once, at the first compressed step: each momentum scaled to the tensors' mean size, so that
  // one compression of all of them together does not drown the small ones.
  if (entries.front().frozen->scaling.item<double>() == 0.0) {
    std::vector<double> sizes;
    for (const Entry& e : entries) sizes.push_back(rms(e.state->exp_avg()));
    double mean = 0;
    for (double s : sizes) mean += s / static_cast<double>(sizes.size());
    for (size_t i = 0; i < entries.size(); ++i) {
      entries[i].frozen->scaling.fill_(sizes[i] > 0 ? mean / sizes[i] : 1.0);
    }
  }
  std::vector<at::Tensor> scaled;
  for (Entry& e : entries) {
    const auto [beta1, beta2] = e.options->betas();
    e.state->step(e.state->step() + 1);
    at::Tensor& m = e.state->exp_avg();
    e.before = m.clone();
    m.mul_(beta1).add_(e.p.grad(), 1 - beta1).mul_(e.frozen->scaling.item<double>());
    scaled.push_back(m.reshape({-1}));
  }
  at::Tensor flat = at::cat(scaled);
  if (averaging()) compressed_all_reduce(*group_, flat, errors_);
  int64_t offset = 0;
  for (Entry& e : entries) {
    at::Tensor& m = e.state->exp_avg();
    m.copy_(flat.narrow(0, offset, m.numel()).view_as(m)).div_(e.frozen->scaling.item<double>());
    mask_unseen(m, e.state->exp_avg_sq());
    offset += m.numel();
  }
  for (Entry& e : entries) {
    const auto [beta1, beta2] = e.options->betas();
    const double eps = e.options->eps(), weight_decay = e.options->weight_decay();
    const at::Tensor& m = e.state->exp_avg();
    const at::Tensor& v = e.state->exp_avg_sq();
    at::Tensor& fresh = e.frozen->exp_avg_sq_fresh;
    // The averaged gradient this momentum implies keeps a fresh variance beside the frozen one.
    const at::Tensor reconstructed = (m - e.before * beta1) / (1 - beta1);
    fresh.mul_(beta2).addcmul_(reconstructed, reconstructed, 1 - beta2);
    const at::Tensor denom = v.sqrt().add_(eps);
    const at::Tensor prelim = m / denom;
    at::Tensor update = weight_decay > 0 ? prelim + e.p * weight_decay : prelim;
    double factor = (denom / (fresh.sqrt() + eps)).max().item<double>();
    if (weight_decay > 0) {
      const double share =
          std::min(1.0, prelim.norm().item<double>() / update.norm().item<double>());
      factor = factor * share + (1.0 - share);
    }
    factor = std::clamp(factor, options_.factor_min, options_.factor_max);
    const double last = e.frozen->last_factor.item<double>();
    factor = std::min(factor, last * (1.0 + options_.factor_threshold));
    factor = std::max(factor, last * (1.0 - options_.factor_threshold));
    e.frozen->last_factor.fill_(factor);
    const double coefficient = e.frozen->coeff.item<double>() * factor;
    e.p.add_(update, -e.options->lr() * coefficient);
    coefficients_.push_back(coefficient);
  }
}

}  // namespace shardtrain
