// NF4 quantization, block-wise, with double-quantized scales (see nf4.h).
#include "model/nf4.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace shardtrain::detail {
namespace {

// Rows of `block` values, the last one padded with zeros.
at::Tensor in_blocks(const at::Tensor& flat, int64_t block) {
  const int64_t rows = (flat.numel() + block - 1) / block;
  at::Tensor padded = at::zeros({rows * block}, flat.options());
  padded.narrow(0, 0, flat.numel()).copy_(flat);
  return padded.view({rows, block});
}

}  // namespace

at::Tensor nf4_codebook() {
  // QLoRA's construction: 8 quantiles of N(0, 1) on the positive side and 7 on the negative
  // side, taken at probabilities evenly spaced from `offset` to 1/2 (the ends are not infinite:
  // offset = (1 - 1/(2*15) + 1 - 1/(2*16)) / 2), plus an exact zero, all divided by the largest.
  const double offset = 0.5 * ((1.0 - 1.0 / 30.0) + (1.0 - 1.0 / 32.0));
  auto quantile = [](const at::Tensor& p) { return std::sqrt(2.0) * at::erfinv(2.0 * p - 1.0); };
  at::Tensor positive = quantile(at::linspace(offset, 0.5, 9, at::kDouble).narrow(0, 0, 8));
  at::Tensor negative = -quantile(at::linspace(offset, 0.5, 8, at::kDouble).narrow(0, 0, 7));
  at::Tensor values = at::cat({positive, at::zeros({1}, at::kDouble), negative});
  values = values / values.max();
  return std::get<0>(values.sort()).to(at::kFloat);
}

int64_t Nf4Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t Nf4Tensor::bytes() const {
  return codes.numel() + scale_codes.numel() + scale_absmax.numel() * 4 + 4;
}

Nf4Tensor nf4_quantize(const at::Tensor& values, int64_t block, int64_t scale_block) {
  if (block <= 0 || block % 2 != 0 || scale_block <= 0) {
    throw std::invalid_argument("nf4: the block size must be a positive even number and the "
                                "scale block positive, got " + std::to_string(block) + " and " +
                                std::to_string(scale_block));
  }
  at::Tensor flat = values.detach().to(at::kCPU, at::kFloat).reshape({-1});
  if (!at::isfinite(flat).all().item<bool>()) {
    throw std::invalid_argument("nf4: the tensor to quantize holds non-finite values");
  }
  Nf4Tensor q;
  q.shape = values.sizes().vec();
  q.block = block;
  q.scale_block = scale_block;

  at::Tensor rows = in_blocks(flat, block);
  at::Tensor absmax = rows.abs().amax(1);
  // An all-zero block divides by 1: its codes are all the exact zero.
  at::Tensor normalized = rows / at::where(absmax > 0, absmax, at::ones_like(absmax)).unsqueeze(1);
  // The nearest code: the codebook's midpoints split [-1, 1] into 16 intervals.
  const at::Tensor codebook = nf4_codebook();
  const at::Tensor midpoints = (codebook.narrow(0, 0, 15) + codebook.narrow(0, 1, 15)) / 2;
  at::Tensor index = at::bucketize(normalized.reshape({-1}), midpoints, /*out_int32=*/true)
                         .to(at::kByte)
                         .view({-1, 2});
  q.codes = at::bitwise_or(index.select(1, 0), at::bitwise_left_shift(index.select(1, 1), 4))
                .contiguous();

  // Double quantization: the absmaxes, centred on their mean, to 8 bits per group of 256.
  q.scale_mean = absmax.mean().item<float>();
  at::Tensor centred = in_blocks(absmax - q.scale_mean, scale_block);
  at::Tensor group_max = centred.abs().amax(1);
  q.scale_absmax = group_max.contiguous();
  at::Tensor divisor = at::where(group_max > 0, group_max, at::ones_like(group_max)).unsqueeze(1);
  q.scale_codes = at::round(centred / divisor * 127.0)
                      .clamp(-127, 127)
                      .to(at::kChar)
                      .reshape({-1})
                      .narrow(0, 0, absmax.numel())
                      .contiguous();
  return q;
}

at::Tensor nf4_block_scales(const Nf4Tensor& q) {
  const int64_t blocks = q.scale_codes.numel();
  at::Tensor groups = in_blocks(q.scale_codes.to(at::kFloat), q.scale_block);
  at::Tensor scales = groups / 127.0 * q.scale_absmax.unsqueeze(1) + q.scale_mean;
  return scales.reshape({-1}).narrow(0, 0, blocks);
}

at::Tensor nf4_dequantize(const Nf4Tensor& q, at::ScalarType dtype) {
  at::Tensor low = at::bitwise_and(q.codes, 0x0F);
  at::Tensor high = at::bitwise_right_shift(q.codes, 4);
  at::Tensor index = at::stack({low, high}, 1).reshape({-1}).to(at::kLong);
  at::Tensor values = nf4_codebook().index_select(0, index).view({-1, q.block});
  values = values * nf4_block_scales(q).unsqueeze(1);
  return values.reshape({-1}).narrow(0, 0, q.numel()).reshape(q.shape).to(dtype);
}

}  // namespace shardtrain::detail
