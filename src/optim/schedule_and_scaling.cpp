#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "shardtrain/optim.h"

namespace shardtrain {

double LrSchedule::at(int64_t step) const {
  if (step < warmup && warmup_type == "log") {
    // ln(1) / ln(1) for a one-step warmup: the step takes the whole rate.
    return warmup == 1 ? lr
                       : lr * std::log(static_cast<double>(step + 1)) /
                             std::log(static_cast<double>(warmup));
  }
  if (step < warmup) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (kind == "constant") return lr;
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup);
  const double progress =
      std::min(1.0, static_cast<double>(step - warmup) / static_cast<double>(decay_steps));
  if (kind == "linear") return lr + (min_lr - lr) * progress;
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm) {
  // The squares summed in fp64 on the gradients' device, one parameter after another (the order
  // of a host-side sum), and read back once: on a GPU, one synchronization per step.
  at::Tensor total;
  for (const auto& p : parameters) {
    if (!p.grad().defined()) continue;
    const at::Tensor squares = p.grad().to(at::kDouble).pow(2).sum();
    total = total.defined() ? total.add_(squares) : squares;
  }
  const double norm = total.defined() ? std::sqrt(total.item<double>()) : 0.0;
  if (max_norm > 0 && norm > max_norm) {
    // The small epsilon is PyTorch's: it keeps the factor finite for a zero norm.
    const double factor = max_norm / (norm + 1e-6);
    for (const auto& p : parameters) {
      if (p.grad().defined()) p.grad().mul_(factor);
    }
  }
  return norm;
}

bool grads_are_finite(const std::vector<at::Tensor>& parameters) {
  // One flag on the gradients' device, read back once.
  at::Tensor finite;
  for (const auto& p : parameters) {
    if (!p.grad().defined()) continue;
    const at::Tensor all = at::isfinite(p.grad()).all();
    finite = finite.defined() ? finite.logical_and_(all) : all;
  }
  return !finite.defined() || finite.item<bool>();
}

LossScaler::LossScaler(Mode mode, double initial_scale, int64_t window, double min_scale,
                       double growth, double backoff)
    : mode_(mode),
      scale_(mode == Mode::kNone ? 1.0 : initial_scale),
      window_(window),
      min_scale_(min_scale),
      growth_(growth),
      backoff_(backoff) {}

LossScaler LossScaler::from_config(const std::string& loss_scale, double initial_scale,
                                   int64_t window, double min_scale) {
  if (loss_scale == "none") return LossScaler(Mode::kNone);
  if (loss_scale == "dynamic") return LossScaler(Mode::kDynamic, initial_scale, window, min_scale);
  return LossScaler(Mode::kFixed, std::stod(loss_scale), window, min_scale);
}

bool LossScaler::unscale(const std::vector<at::Tensor>& parameters) const {
  if (mode_ != Mode::kNone) {
    for (const auto& p : parameters) {
      if (p.grad().defined()) p.grad().div_(scale_);
    }
  }
  return grads_are_finite(parameters);
}

void LossScaler::set_hysteresis(int64_t hysteresis, bool consecutive) {
  if (hysteresis < 1) {
    throw std::invalid_argument("loss-scale hysteresis must be at least 1, got " +
                                std::to_string(hysteresis));
  }
  hysteresis_ = hysteresis;
  consecutive_ = consecutive;
  hysteresis_left_ = hysteresis;
}

bool LossScaler::update(bool grads_finite) {
  if (grads_finite) {
    if (consecutive_) hysteresis_left_ = hysteresis_;
    if (mode_ == Mode::kDynamic && ++good_steps_ >= window_) {
      scale_ *= growth_;
      good_steps_ = 0;
      hysteresis_left_ = hysteresis_;
    }
    return true;
  }
  ++skipped_;
  good_steps_ = 0;
  if (mode_ == Mode::kDynamic) {
    if (hysteresis_left_ <= 1) {
      scale_ = std::max(min_scale_, scale_ * backoff_);
    } else {
      --hysteresis_left_;
    }
  }
  return false;
}

void LossScaler::restore(double scale, int64_t good_steps, int64_t skipped,
                         int64_t hysteresis_left) {
  scale_ = scale;
  good_steps_ = good_steps;
  skipped_ = skipped;
  hysteresis_left_ = hysteresis_left > 0 ? std::min(hysteresis_left, hysteresis_) : hysteresis_;
}

}  // namespace shardtrain
