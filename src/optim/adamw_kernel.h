// The per-element AdamW update on raw arrays, one implementation per instruction set.
#pragma once

#include <cstdint>

#include "shardtrain/fused_adamw.h"

namespace shardtrain::detail {

// The scalars of one update, rounded to float once (as LibTorch's scalar arguments are).
struct AdamWScalars {
  bool has_decay = false;
  float decay = 1;  // 1 - lr * weight_decay
  float beta1 = 0, one_minus_beta1 = 0, beta2 = 0, one_minus_beta2 = 0;
  float sqrt_bias_correction2 = 1;
  float eps = 0;
  float neg_step_size = 0;  // -lr / (1 - beta1^t)

  static AdamWScalars from(const AdamWStep& hyper);
};

enum class AdamIsa { kGeneric, kAvx2, kAvx512 };

// The widest instruction set this CPU has (capped by SHARDTRAIN_ADAM_ISA), decided once.
AdamIsa adam_isa();
const char* adam_isa_name(AdamIsa isa);

// Updates n elements in place on the calling thread; bf16 may be null.
void adamw_range(AdamIsa isa, const AdamWScalars& s, float* param, const float* grad,
                 float* exp_avg, float* exp_avg_sq, uint16_t* bf16, int64_t n);

// adamw_range over [0, n) split across at::get_num_threads() threads in large ranges.
void adamw_parallel(const AdamWScalars& s, float* param, const float* grad, float* exp_avg,
                    float* exp_avg_sq, uint16_t* bf16, int64_t n);

// Validates fused_adamw_step's arguments (exp_avg and exp_avg_sq only when given), throwing
// std::invalid_argument; returns param_bf16_out's data, or null without one.
uint16_t* check_adamw_args(const at::Tensor& param, const at::Tensor& grad,
                           const at::Tensor* exp_avg, const at::Tensor* exp_avg_sq,
                           const AdamWStep& hyper, const at::Tensor* param_bf16_out);

}  // namespace shardtrain::detail
