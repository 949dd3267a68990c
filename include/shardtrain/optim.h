// Learning-rate schedules, gradient clipping and loss scaling for mixed precision.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

namespace shardtrain {

// A warmup over `warmup` steps, then "cosine" (to min_lr at total_steps), "linear" (to min_lr)
// or "constant". The warmup is "linear" (lr/warmup at step 0 up to lr) or "log" (DeepSpeed's
// default shape: lr * ln(step + 1) / ln(warmup), so 0 at step 0).
struct LrSchedule {
  double lr = 1e-3;
  double min_lr = 0.0;
  int64_t warmup = 0;
  int64_t total_steps = 1;
  std::string kind = "cosine";
  std::string warmup_type = "linear";
  // Learning rate of step `step` (0-based).
  double at(int64_t step) const;
};

// Scales the gradients so their global L2 norm is at most max_norm, and returns the norm
// before clipping (computed in fp64 over every gradient). Parameters without a gradient are
// skipped. max_norm <= 0 only measures.
double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm);

// True when every gradient is finite.
bool grads_are_finite(const std::vector<at::Tensor>& parameters);

// Dynamic loss scaling for fp16: the loss is multiplied by scale() before backward; after it,
// unscale() divides the gradients back and reports overflow. A step with inf/nan gradients is
// skipped and the scale multiplied by backoff (not below min_scale); after `window`
// consecutive good steps it is multiplied by growth. With hysteresis H (DeepSpeed's), the scale
// is lowered only at the H-th overflow since the count was last refilled: at a growth, or with
// `consecutive` at every good step. A fixed scaler never changes its scale; a disabled one has
// scale 1.
class LossScaler {
 public:
  enum class Mode { kNone, kFixed, kDynamic };
  LossScaler(Mode mode = Mode::kNone, double initial_scale = 65536.0, int64_t window = 1000,
             double min_scale = 1.0, double growth = 2.0, double backoff = 0.5);
  // From the config strings: "none", "dynamic" or a number.
  static LossScaler from_config(const std::string& loss_scale, double initial_scale, int64_t window,
                                double min_scale);

  double scale() const { return scale_; }
  bool enabled() const { return mode_ != Mode::kNone; }
  // Divides every gradient by the scale; returns false when any gradient is inf or nan.
  bool unscale(const std::vector<at::Tensor>& parameters) const;
  // Records the outcome of a step; returns whether the optimizer should step.
  bool update(bool grads_finite);

  // Overflows absorbed before the scale is lowered (1: lowered at every overflow).
  void set_hysteresis(int64_t hysteresis, bool consecutive);

  int64_t good_steps() const { return good_steps_; }
  int64_t skipped_steps() const { return skipped_; }
  // Overflows left before the scale is lowered.
  int64_t hysteresis_left() const { return hysteresis_left_; }
  // For checkpoints (a checkpoint that has no hysteresis count keeps a full one).
  void restore(double scale, int64_t good_steps, int64_t skipped, int64_t hysteresis_left = 0);

 private:
  Mode mode_;
  double scale_;
  int64_t window_;
  double min_scale_;
  double growth_;
  double backoff_;
  int64_t hysteresis_ = 1;
  bool consecutive_ = false;
  int64_t good_steps_ = 0;
  int64_t skipped_ = 0;
  int64_t hysteresis_left_ = 1;
};

}  // namespace shardtrain
