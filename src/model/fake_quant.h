// Quantization-aware training's quantizers (DeepSpeed's compression_training): values rounded
// to a grid in forward, gradients passed through unchanged (the straight-through estimator).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace shardtrain::detail {

// How a layer's weight or input is quantized; bits 0: not at all.
struct Quantizer {
  int64_t bits = 0;
  int64_t groups = 1;  // a weight's elements in this many equal groups, each of its own scale
  bool symmetric = true;
};

// What the quantizing layers of one model read in forward: whether each technique has started
// (its offset reached). Set by the trainer before each step.
struct CompressionSwitches {
  bool weights = false;
  bool activations = false;
};

// `x` as `groups` rows of equal size, each rounded to a grid of 2^bits values spanning its own
// range: symmetric (-max|x| .. max|x|, scale 2 max|x| / 2^bits) or asymmetric (min .. max, with a
// rounded zero point); 2 bits is ternary (0 or +-alpha, past 0.7 of the mean magnitude) and 1
// binary (the sign times the mean magnitude). A group without range (asymmetric: all its values
// equal; symmetric: all zero) is left as it is. Computed in fp32, returned in x's dtype.
at::Tensor quantized_values(const at::Tensor& x, int64_t bits, int64_t groups, bool symmetric);

// quantized_values in forward, the identity in backward (x's gradient is the result's).
at::Tensor fake_quantize(const at::Tensor& x, const Quantizer& quantizer);

// A linear layer's input quantized token by token (one group per row of the last dimension), on
// a uniform grid (3 bits or more).
at::Tensor fake_quantize_tokens(const at::Tensor& x, const Quantizer& quantizer);

}  // namespace shardtrain::detail
