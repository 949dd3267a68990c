// QLoRA's 4-bit NormalFloat (NF4) storage for frozen weights: each block of 64 values keeps one
// 4-bit code per value (an index into 16 quantiles of the standard normal, scaled to [-1, 1],
// with an exact zero) and the block's absolute maximum; those maxima are themselves quantized
// to 8 bits in groups of 256 after subtracting their mean ("double quantization"), so the whole
// costs about 0.516 bytes per value. Dettmers et al. 2023 (arXiv:2305.14314), section 3.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace shardtrain::detail {

// The 16 NF4 values, ascending: -1, ..., 0 (index 7), ..., 1 (fp32).
at::Tensor nf4_codebook();

struct Nf4Tensor {
  std::vector<int64_t> shape;
  int64_t block = 64;          // values per absmax
  int64_t scale_block = 256;   // absmaxes per second-level scale
  at::Tensor codes;            // uint8 [ceil(blocks * block / 2)]: two codes a byte, low nibble first
  at::Tensor scale_codes;      // int8 [blocks]: (absmax - scale_mean) / scale_absmax * 127
  at::Tensor scale_absmax;     // fp32 [ceil(blocks / scale_block)]
  float scale_mean = 0;
  int64_t numel() const;
  // Bytes of the stored form (codes, 8-bit scales, second-level scales and the mean).
  int64_t bytes() const;
};

// Quantizes `values` (any floating dtype, any shape; copied to fp32 on the host first). Throws
// std::invalid_argument for a block size that is not a positive even number, or non-finite values.
Nf4Tensor nf4_quantize(const at::Tensor& values, int64_t block = 64, int64_t scale_block = 256);
// The block absmaxes as stored (after double quantization), fp32 [blocks].
at::Tensor nf4_block_scales(const Nf4Tensor& q);
// The values back, shaped as quantized, in `dtype`.
at::Tensor nf4_dequantize(const Nf4Tensor& q, at::ScalarType dtype = at::kFloat);
// The same values written into `out`: a contiguous fp32 CPU tensor of q.numel() elements.
void nf4_dequantize_into(const Nf4Tensor& q, const at::Tensor& out);

// The quantized form of a tensor of `shape` as one byte buffer, what a frozen parameter stores:
// the codes, the 8-bit scales, zero padding to a multiple of 4 bytes, the second-level scales
// (fp32) and the mean (fp32). Its size depends only on the shape and block sizes.
int64_t nf4_packed_bytes(at::IntArrayRef shape, int64_t block = 64, int64_t scale_block = 256);
at::Tensor nf4_pack(const Nf4Tensor& q);  // uint8 [nf4_packed_bytes(q.shape)]
// The quantized tensor a packed buffer holds: codes and scales are views of `packed` (any
// storage offset), the second-level scales and the mean copies. Throws std::invalid_argument
// when `packed` is not uint8 of nf4_packed_bytes(shape).
Nf4Tensor nf4_unpack(const at::Tensor& packed, at::IntArrayRef shape, int64_t block = 64,
                     int64_t scale_block = 256);

}  // namespace shardtrain::detail
