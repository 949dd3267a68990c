// NF4 quantization, block-wise, with double-quantized scales (see nf4.h).
#include "model/nf4.h"

#include <ATen/Parallel.h>

#include <cstring>

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

void nf4_dequantize_into(const Nf4Tensor& q, const at::Tensor& out) {
  if (!q.codes.is_cpu() || !q.codes.is_contiguous() || !out.is_cpu() || !out.is_contiguous() ||
      out.scalar_type() != at::kFloat || out.numel() != q.numel()) {
    throw std::invalid_argument("nf4_dequantize_into: needs contiguous CPU codes and a contiguous "
                                "fp32 CPU output of " + std::to_string(q.numel()) + " elements");
  }
  // One pass from the codes into the output, with no index or intermediate tensors; the same
  // single fp32 product per value as the tensor expression in nf4_dequantize.
  {
    const at::Tensor scales = nf4_block_scales(q).contiguous();
    const at::Tensor codebook = nf4_codebook().contiguous();
    const int64_t n = q.numel();
    const uint8_t* codes = q.codes.data_ptr<uint8_t>();
    const float* scale = scales.data_ptr<float>();
    const float* value = codebook.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const int64_t half = q.block / 2;
    at::parallel_for(0, scales.numel(), 64, [&](int64_t lo, int64_t hi) {
      for (int64_t b = lo; b < hi; ++b) {
        for (int64_t j = 0; j < half; ++j) {
          const int64_t i = 2 * (b * half + j);
          const uint8_t byte = codes[b * half + j];
          if (i < n) o[i] = value[byte & 0x0F] * scale[b];
          if (i + 1 < n) o[i + 1] = value[byte >> 4] * scale[b];
        }
      }
    });
  }
}

at::Tensor nf4_dequantize(const Nf4Tensor& q, at::ScalarType dtype) {
  if (q.codes.is_cpu() && q.codes.is_contiguous()) {
    at::Tensor out = at::empty({q.numel()}, at::kFloat);
    nf4_dequantize_into(q, out);
    return out.view(q.shape).to(dtype);
  }
  at::Tensor low = at::bitwise_and(q.codes, 0x0F);
  at::Tensor high = at::bitwise_right_shift(q.codes, 4);
  at::Tensor index = at::stack({low, high}, 1).reshape({-1}).to(at::kLong);
  at::Tensor values = nf4_codebook().index_select(0, index).view({-1, q.block});
  values = values * nf4_block_scales(q).unsqueeze(1);
  return values.reshape({-1}).narrow(0, 0, q.numel()).reshape(q.shape).to(dtype);
}

namespace {

struct PackedLayout {
  int64_t blocks = 0, groups = 0;
  int64_t codes = 0, scales = 0, absmax = 0, mean = 0, total = 0;  // byte offsets and size
};

PackedLayout packed_layout(at::IntArrayRef shape, int64_t block, int64_t scale_block) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  PackedLayout l;
  l.blocks = (n + block - 1) / block;
  l.groups = (l.blocks + scale_block - 1) / scale_block;
  l.codes = 0;
  l.scales = l.blocks * block / 2;
  l.absmax = (l.scales + l.blocks + 3) / 4 * 4;
  l.mean = l.absmax + 4 * l.groups;
  l.total = l.mean + 4;
  return l;
}

}  // namespace

int64_t nf4_packed_bytes(at::IntArrayRef shape, int64_t block, int64_t scale_block) {
  return packed_layout(shape, block, scale_block).total;
}

at::Tensor nf4_pack(const Nf4Tensor& q) {
  const PackedLayout l = packed_layout(q.shape, q.block, q.scale_block);
  at::Tensor packed = at::zeros({l.total}, at::kByte);
  packed.narrow(0, l.codes, l.scales).copy_(q.codes);
  packed.narrow(0, l.scales, l.blocks).copy_(q.scale_codes.view(at::kByte));
  std::memcpy(packed.data_ptr<uint8_t>() + l.absmax, q.scale_absmax.data_ptr<float>(),
              static_cast<size_t>(4 * l.groups));
  std::memcpy(packed.data_ptr<uint8_t>() + l.mean, &q.scale_mean, 4);
  return packed;
}

Nf4Tensor nf4_unpack(const at::Tensor& packed, at::IntArrayRef shape, int64_t block,
                     int64_t scale_block) {
  const PackedLayout l = packed_layout(shape, block, scale_block);
  if (packed.scalar_type() != at::kByte || packed.dim() != 1 || packed.numel() != l.total ||
      !packed.is_contiguous()) {
    throw std::invalid_argument("nf4: a packed tensor of shape " + c10::str(shape) + " is " +
                                std::to_string(l.total) + " contiguous uint8 bytes, got " +
                                c10::toString(packed.scalar_type()) + " " +
                                c10::str(packed.sizes()));
  }
  Nf4Tensor q;
  q.shape = shape.vec();
  q.block = block;
  q.scale_block = scale_block;
  q.codes = packed.narrow(0, l.codes, l.scales);
  q.scale_codes = packed.narrow(0, l.scales, l.blocks).view(at::kChar);
  // The fp32 parts may sit at any address inside a gathered buffer: copied out.
  q.scale_absmax = at::empty({l.groups}, at::kFloat);
  std::memcpy(q.scale_absmax.data_ptr<float>(), packed.data_ptr<uint8_t>() + l.absmax,
              static_cast<size_t>(4 * l.groups));
  std::memcpy(&q.scale_mean, packed.data_ptr<uint8_t>() + l.mean, 4);
  return q;
}

}  // namespace shardtrain::detail
