// fp8 training emulated (precision.fp8): the linear layers of the blocks compute with their input,
// weight and output gradient rounded to an fp8 format after multiplying by a per-tensor scale
// (Transformer Engine's delayed scaling: each scale from the largest magnitudes of the steps
// before). The products of the rounded values run in fp32 and are divided by the scales, which is
// what an fp8 matrix unit with fp32 accumulation computes; no fp8 arithmetic is used, so a step
// takes longer than without, not shorter.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace shardtrain {
class ProcessGroup;
}

namespace shardtrain::detail {

enum class Fp8Format { kE4M3, kE5M2 };

// The format's largest finite value: 448 (E4M3, as Transformer Engine and the OCP format define
// it) or 57344 (E5M2).
double fp8_max(Fp8Format format);

// x (any floating dtype) rounded to the nearest value of the format, ties to even, magnitudes
// past its largest value saturated to it; NaN stays NaN. Subnormals included (E4M3's smallest
// 2^-9, E5M2's 2^-16). Returned in fp32.
at::Tensor round_to_fp8(const at::Tensor& x, Fp8Format format);

// Transformer Engine's DelayedScaling recipe as shardtrain runs it.
struct Fp8Recipe {
  bool hybrid = true;        // E4M3 forward, E5M2 gradients; false: E4M3 for both
  int64_t history = 1024;    // the steps whose largest magnitudes are kept
  bool most_recent = false;  // the scale from the last step's alone, else from the history's max
  int64_t margin = 0;        // scale = fp8 max / amax / 2^margin
};

// One layer's scaling state, for its input (0), weight (1) and output gradient (2).
struct Fp8Scaling {
  std::shared_ptr<const Fp8Recipe> recipe;
  at::Tensor amax;     // [3] fp32: the largest magnitude of each in this step so far
  at::Tensor history;  // [history, 3] fp32: row 0 the last step's, row 1 the one before, ...
  at::Tensor scale;    // [3] fp32: what the values are multiplied by before rounding

  explicit Fp8Scaling(std::shared_ptr<const Fp8Recipe> recipe);
  // The three tensors on `device` (the model's).
  void to(const at::Device& device);
};

// x W^T + b with x, W rounded to E4M3 at the layer's scales (and the output gradient, in
// backward, to E5M2 or E4M3); x's and W's gradients are the products of the rounded gradient
// with the rounded W and x (an fp8 GEMM's), b's the sum of the unrounded gradient. Records the
// magnitudes in `scaling.amax`. The result has the autocast dtype where autocast is on, else x's.
at::Tensor fp8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                      Fp8Scaling& scaling);

// Gives every linear layer of `blocks` (not LoRA adapters) its own scaling under `recipe`;
// returns them in the blocks' order.
std::vector<std::shared_ptr<Fp8Scaling>> enable_fp8(torch::nn::Module& blocks,
                                                    std::shared_ptr<const Fp8Recipe> recipe);

// After each step's backward: every rank's largest magnitudes combined (max over `group`, when
// given), pushed into each layer's history, and the scales for the next step computed from it
// (a magnitude of 0 or not finite keeps the scale as it was). The step's amax starts again at 0.
void update_fp8_scales(const std::vector<std::shared_ptr<Fp8Scaling>>& layers, ProcessGroup* group);

}  // namespace shardtrain::detail
