// DeepSpeed's large-batch optimizers, LAMB, 1-bit Adam and 1-bit LAMB, on torch::optim::AdamW's
// options and per-parameter state (step, exp_avg, exp_avg_sq): checkpoints, resume and
// resharding read and write them as AdamW's (1-bit LAMB adds its own tensors, extra_state). They
// need whole parameters on every data-parallel rank (a trust ratio is a whole tensor's; the
// 1-bit ones average the momentum instead of the gradients), so they run under the replicated
// strategies ("none", "ddp") only.
#pragma once

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardtrain/dist.h"

namespace shardtrain {

struct LambOptions {
  // The trust ratio ||p|| / ||update|| is clamped to [min_coeff, max_coeff] (DeepSpeed's
  // defaults).
  double min_coeff = 0.01;
  double max_coeff = 10.0;
  bool bias_correction = true;
};

// LAMB (You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes"),
// as DeepSpeed's Lamb computes it, for each parameter p with gradient g at update t:
//   m = beta1*m + (1-beta1)*g,  v = beta2*v + (1-beta2)*g*g
//   u = m / (sqrt(v) + eps) + weight_decay * p
//   ratio = clamp(||p|| / ||u||, min_coeff, max_coeff), or 1 when either norm is 0
//   p -= step_size * ratio * u,  step_size = lr * sqrt(1-beta2^t) / (1-beta1^t), or lr without
//   bias correction.
// Any device and floating dtype (the state follows the parameter's). amsgrad is rejected.
class Lamb : public torch::optim::AdamW {
 public:
  Lamb(std::vector<torch::optim::OptimizerParamGroup> param_groups,
       torch::optim::AdamWOptions defaults, LambOptions lamb = {});

  at::Tensor step(LossClosure closure = nullptr) override;

  // The ratio each parameter with a gradient took at the last step, in parameter-group order.
  const std::vector<double>& last_ratios() const { return ratios_; }

 private:
  LambOptions lamb_;
  std::vector<double> ratios_;
};

// The compression errors one tensor carries from one compressed_all_reduce to the next: this
// rank's (`worker`, the tensor's numel rounded up to a multiple of 8 x the group size) and those
// of the chunk this rank averages (`server`, 1/size of that). Undefined before the first call.
struct CompressionErrors {
  at::Tensor worker;
  at::Tensor server;
};

// Averages `tensor` (fp32, contiguous, on the group's device) over `group` in place, sending
// signs instead of values (DeepSpeed's compressed_allreduce for 1-bit Adam), with error
// feedback: each member adds its carried error, keeps x's sign and one scale ||x|| / sqrt(n),
// and carries what that loses to its next call. The signs (one bit per element, packed) go to
// the member that averages their chunk (an all_to_all) with the scales (an all_gather); that
// member compresses its averaged chunk the same way and every member gathers every chunk (two
// all_gathers). About 2 bits per element leave each member instead of 32 x 2(size-1)/size for a
// ring all-reduce. Every member gets the same result. Collective.
void compressed_all_reduce(ProcessGroup& group, at::Tensor tensor, CompressionErrors& errors);

// What 1-bit Adam and 1-bit LAMB share: `freeze_step` updates on averaged gradients (the
// warmup), then each rank's gradients stay its own and the momentum is averaged with
// compressed_all_reduce over the data-parallel group instead.
class CompressedMomentumOptimizer : public torch::optim::AdamW {
 public:
  CompressedMomentumOptimizer(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                              torch::optim::AdamWOptions defaults, int64_t freeze_step,
                              const char* name);

  // True when the next step's gradients must be left unaveraged (each rank's own): 1-bit Adam
  // and LAMB past their warmup, 0/1 Adam except at its variance updates.
  virtual bool compressing() const { return updates() >= freeze_step_; }
  // Updates taken so far (restored with the state on resume).
  int64_t updates() const;
  // The group the momentum is averaged over once compressing (null: one data-parallel rank).
  void set_group(ProcessGroup* group) { group_ = group; }

  // Per-parameter state beyond AdamW's that a checkpoint keeps as "optim.NAME.<suffix>": the
  // optimizer's own tensors, restored in place. Empty for a parameter without state yet.
  virtual std::vector<std::pair<std::string, at::Tensor>> extra_state(
      const at::Tensor& /*param*/) const {
    return {};
  }

 protected:
  using StateKey =
      std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;
  bool averaging() const { return group_ && group_->size() > 1; }
  // After the warmup: the momentum of elements whose frozen variance is 0 (no gradient reached
  // them in the warmup: an embedding's unused rows) is held at 0. A compressed average gives
  // every element +-scale, which divided by sqrt(0) + eps would be a step of scale/eps
  // (DeepSpeed masks them with a user-supplied exp_avg_mask).
  static void mask_unseen(at::Tensor& exp_avg, const at::Tensor& exp_avg_sq);

  int64_t freeze_step_;
  ProcessGroup* group_ = nullptr;
};

// 1-bit Adam (Tang et al., "1-bit Adam: Communication Efficient Large-Scale Training with Adam's
// Convergence Speed"), as DeepSpeed's OneBitAdam computes it. For the first `freeze_step`
// updates it is Adam on averaged gradients; after them the variance v is frozen, each rank's
// gradients stay its own, and the momentum is averaged with compressed_all_reduce:
//   warmup:       m = beta1*m + (1-beta1)*g_avg,   v = beta2*v + (1-beta2)*g_avg^2
//   compression:  m = compressed_average(beta1*m + (1-beta1)*g_local), 0 where v is 0
//   both:         p -= lr * (m / (sqrt(v) + eps) + weight_decay * p)
// without bias corrections (DeepSpeed's OneBitAdam applies none). The compression errors are
// not part of the state a checkpoint keeps: a resume starts them at zero, as DeepSpeed does.
class OneBitAdam : public CompressedMomentumOptimizer {
 public:
  OneBitAdam(std::vector<torch::optim::OptimizerParamGroup> param_groups,
             torch::optim::AdamWOptions defaults, int64_t freeze_step);

  at::Tensor step(LossClosure closure = nullptr) override;

 private:
  std::map<StateKey, CompressionErrors> errors_;  // by parameter
};

struct OneBitLambOptions {
  int64_t freeze_step = 100000;
  double min_coeff = 0.01, max_coeff = 10.0;  // the warmup's trust-ratio clamp
  // The frozen ratio: an average of the warmup's ratios with this decay.
  double coeff_beta = 0.9;
  // After the warmup the frozen ratio is scaled by a factor in [factor_min, factor_max] that
  // moves by at most factor_threshold (relative) per step.
  double factor_max = 4.0, factor_min = 0.5, factor_threshold = 0.1;
};

// 1-bit LAMB (Li et al., "1-bit LAMB: Communication Efficient Large-Scale Large-Batch Training
// with LAMB's Convergence Speed"), as DeepSpeed's OneBitLamb computes it, without bias
// corrections. Warmup (freeze_step updates, averaged gradients): LAMB, whose ratios (those not
// 1) feed an exponential average c (decay coeff_beta); v is copied to v_fresh at the last one.
// After it, with each rank's own gradients:
//   once:  s_p = mean_q(rms(m_q)) / rms(m_p)   (balances the tensors before one compression)
//   m_p = compressed_average over all tensors of s_p * (beta1*m_p + (1-beta1)*g) / s_p,
//         0 where v is 0
//   g~ = (m - beta1*m_before) / (1-beta1),  v_fresh = beta2*v_fresh + (1-beta2)*g~^2
//   u = m / (sqrt(v) + eps) + weight_decay * p
//   f = the largest (sqrt(v) + eps) / (sqrt(v_fresh) + eps) over the tensor (blended towards 1
//       by weight decay's share of u), clamped to [factor_min, factor_max] and to within
//       factor_threshold of the last f
//   p -= lr * c * f * u
// v_fresh, c, the last f and s are checkpointed (extra_state); the compression errors are not.
class OneBitLamb : public CompressedMomentumOptimizer {
 public:
  OneBitLamb(std::vector<torch::optim::OptimizerParamGroup> param_groups,
             torch::optim::AdamWOptions defaults, OneBitLambOptions options);

  at::Tensor step(LossClosure closure = nullptr) override;
  std::vector<std::pair<std::string, at::Tensor>> extra_state(
      const at::Tensor& param) const override;

  // The coefficient each parameter's update took at the last step (the ratio in the warmup,
  // c x f after it), in parameter-group order.
  const std::vector<double>& last_coefficients() const { return coefficients_; }

 private:
  struct Frozen {
    at::Tensor exp_avg_sq_fresh;  // like the parameter
    at::Tensor coeff;             // c, 0-dim double
    at::Tensor last_factor;       // f, 0-dim double (1 at first)
    at::Tensor scaling;           // s, 0-dim double (0: not taken yet)
  };
  // Created with the parameter's state (by a step, or by extra_state when a checkpoint is
  // restored into it).
  Frozen& frozen_of(const at::Tensor& param) const;
  void warmup_step();
  void compressed_step();

  OneBitLambOptions options_;
  mutable std::map<StateKey, Frozen> frozen_;
  CompressionErrors errors_;  // of all the momenta as one flat tensor
  std::vector<double> coefficients_;
};

struct ZeroOneAdamOptions {
  // The last update of the variance (DeepSpeed's var_freeze_step): after it, local steps.
  int64_t var_freeze_step = 100000;
  // The variance is updated every var_interval steps, var_interval doubling after each
  // var_update_scaler updates (the paper's kappa).
  int64_t var_update_scaler = 16;
  // After the freeze, ranks synchronize every local_step_interval steps, the interval doubling
  // after each local_step_scaler steps up to local_step_clipper (the paper's H).
  int64_t local_step_scaler = 32678;
  int64_t local_step_clipper = 16;
};

// 0/1 Adam (Lu et al., "Maximizing Communication Efficiency for Large-scale Training via 0/1
// Adam"), as DeepSpeed's ZeroOneAdam computes it, without bias corrections. Its first step only
// counts (DeepSpeed's initialization step: the parameters do not move). Then, while the step
// count s is at most var_freeze_step + 1:
//   s a multiple of var_interval: gradients averaged (compressing() false before the step),
//     m = beta1*m + (1-beta1)*g,  v = beta2*v + (1-beta2)*g^2; after var_update_scaler such
//     updates var_interval doubles;
//   otherwise: each rank's gradient compressed_average'd, m = beta1*m + (1-beta1)*that;
// after it (v frozen), gradients stay local: m = beta1*m + (1-beta1)*g and the update is local;
// every local_step_interval steps the ranks exchange their updates since the last exchange
// (scaled by sqrt(v) + eps, compressed_average'd), each replaces its own with the average, and
// m becomes the average's momentum (over minus the sum of the learning rates). Every step:
// p -= lr * (m / (sqrt(v) + eps) + weight_decay * p). Momentum and exchanged updates are held
// at 0 where v is 0 (as 1-bit Adam's). The counters and the parameter at the last exchange are
// checkpointed (extra_state); the compression errors are not.
class ZeroOneAdam : public CompressedMomentumOptimizer {
 public:
  ZeroOneAdam(std::vector<torch::optim::OptimizerParamGroup> param_groups,
              torch::optim::AdamWOptions defaults, ZeroOneAdamOptions options);

  at::Tensor step(LossClosure closure = nullptr) override;
  bool compressing() const override;
  std::vector<std::pair<std::string, at::Tensor>> extra_state(
      const at::Tensor& param) const override;

 private:
  struct Local {
    at::Tensor start;     // the parameter at the last exchange (after the freeze)
    at::Tensor counters;  // kCounters doubles: the intervals, their counters, the lr sum
  };
  Local& local_of(const at::Tensor& param) const;
  // Of the first parameter with state (every parameter's are the same); 1 before any step.
  int64_t var_interval() const;

  ZeroOneAdamOptions options_;
  mutable std::map<StateKey, Local> local_;
  std::map<StateKey, CompressionErrors> errors_;
};

}  // namespace shardtrain
