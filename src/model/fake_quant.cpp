#include "model/fake_quant.h"

#include <torch/types.h>

#include <stdexcept>
#include <string>

namespace shardtrain::detail {

at::Tensor quantized_values(const at::Tensor& x, int64_t bits, int64_t groups, bool symmetric) {
  if (groups < 1 || x.numel() % groups != 0) {
    throw std::invalid_argument("quantization: " + std::to_string(x.numel()) +
                                " values do not split into " + std::to_string(groups) + " groups");
  }
  torch::NoGradGuard no_grad;
  const at::Tensor flat = x.detach().to(at::kFloat).reshape({groups, -1});
  at::Tensor out;
  if (bits == 1) {
    out = flat.sign() * flat.abs().mean(-1, /*keepdim=*/true);
  } else if (bits == 2) {
    const at::Tensor threshold = 0.7 * flat.abs().mean(-1, /*keepdim=*/true);
    const at::Tensor kept = (flat.abs() > threshold).to(at::kFloat);
    const at::Tensor alpha =
        (kept * flat.abs()).sum(-1, /*keepdim=*/true) / kept.sum(-1, /*keepdim=*/true).clamp_min(1);
    out = alpha * ((flat > threshold).to(at::kFloat) - (flat < -threshold).to(at::kFloat));
  } else {
    const double levels = static_cast<double>(int64_t{1} << bits);
    at::Tensor scale, zero;
    if (symmetric) {
      scale = 2 * flat.abs().amax(-1, /*keepdim=*/true) / levels;
    } else {
      const at::Tensor low = flat.amin(-1, /*keepdim=*/true);
      scale = (flat.amax(-1, /*keepdim=*/true) - low) / levels;
      zero = (low / scale).round() * scale;
    }
    // A group without range (all its values equal) has no grid: it stays as it is.
    const at::Tensor flat_group = scale == 0;
    scale = scale.masked_fill(flat_group, 1);
    if (symmetric) {
      out = (flat / scale).round().clamp(-levels / 2, levels / 2 - 1) * scale;
    } else {
      zero = zero.masked_fill(flat_group, 0);
      out = ((flat - zero) / scale).round().clamp(0, levels - 1) * scale + zero;
    }
    out = at::where(flat_group, flat, out);
  }
  return out.reshape(x.sizes()).to(x.scalar_type());
}

at::Tensor fake_quantize(const at::Tensor& x, const Quantizer& quantizer) {
  const at::Tensor q = quantized_values(x, quantizer.bits, quantizer.groups, quantizer.symmetric);
  const at::Tensor held = x.detach();
  return x + (q - held);
}

at::Tensor fake_quantize_tokens(const at::Tensor& x, const Quantizer& quantizer) {
  if (x.numel() == 0) return x;
  Quantizer per_token = quantizer;
  per_token.groups = x.numel() / x.size(-1);
  return fake_quantize(x, per_token);
}

}  // namespace shardtrain::detail
