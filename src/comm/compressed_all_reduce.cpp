// 1-bit compressed averaging with error feedback (shardtrain/optimizers.h).
#include <cmath>
#include <stdexcept>
#include <string>

#include "shardtrain/optimizers.h"

namespace shardtrain {
namespace {

// Bit weights of one packed byte, most significant first.
at::Tensor bit_weights(const at::Device& device, at::ScalarType dtype) {
  return at::tensor({128, 64, 32, 16, 8, 4, 2, 1}, at::TensorOptions().dtype(at::kInt))
      .to(device, dtype);
}

// Eight booleans per byte (numel a multiple of 8).
at::Tensor pack_bits(const at::Tensor& bits) {
  return (bits.reshape({-1, 8}).to(at::kInt) * bit_weights(bits.device(), at::kInt))
      .sum(1)
      .to(at::kByte);
}

// The inverse: numel x 8 signs, +1 for a set bit and -1 for a clear one, as fp32.
at::Tensor unpack_signs(const at::Tensor& packed) {
  const at::Tensor bits =
      at::bitwise_and(packed.reshape({-1, 1}), bit_weights(packed.device(), at::kByte).view({1, 8}))
          .ne(0);
  return bits.reshape({-1}).to(at::kFloat).mul_(2).sub_(1);
}

// x's scale ||x|| / sqrt(numel) and whether each element is >= 0 (a zero counts as positive);
// `error` becomes what scale x sign(x) loses.
at::Tensor compress(const at::Tensor& x, at::Tensor& error, at::Tensor& positive) {
  const at::Tensor scale = x.norm().div_(std::sqrt(static_cast<double>(x.numel())));
  positive = x.ge(0);
  error.copy_(x - scale * positive.to(at::kFloat).mul_(2).sub_(1));
  return scale.reshape({1});
}

}  // namespace

void compressed_all_reduce(ProcessGroup& group, at::Tensor tensor, CompressionErrors& errors) {
  if (tensor.scalar_type() != at::kFloat || !tensor.is_contiguous()) {
    throw std::invalid_argument("compressed_all_reduce: the tensor must be contiguous fp32, got " +
                                std::string(c10::toString(tensor.scalar_type())));
  }
  const int64_t size = group.size();
  const int64_t n = tensor.numel();
  // Each member's chunk packs into whole bytes.
  const int64_t unit = 8 * size;
  const int64_t padded = (n + unit - 1) / unit * unit;
  const int64_t chunk = padded / size;
  const auto options = tensor.options();
  if (!errors.worker.defined()) {
    errors.worker = at::zeros({padded}, options);
    errors.server = at::zeros({chunk}, options);
  }
  if (errors.worker.numel() != padded || errors.server.numel() != chunk) {
    throw std::invalid_argument(
        "compressed_all_reduce: the carried errors are for another tensor size or group (" +
        std::to_string(errors.worker.numel()) + " elements, expected " + std::to_string(padded) +
        ")");
  }
  at::Tensor buffer = at::zeros({padded}, options);
  buffer.narrow(0, 0, n).copy_(tensor.reshape({-1}));
  buffer.add_(errors.worker);

  // Each member's signs of chunk r go to member r; every member's scale to every member.
  at::Tensor positive;
  const at::Tensor scale = compress(buffer, errors.worker, positive);
  at::Tensor signs = at::empty({padded / 8}, options.dtype(at::kByte));
  group.all_to_all(pack_bits(positive), signs, {}, {})->wait();
  at::Tensor scales = at::empty({size}, options);
  group.all_gather(scale, scales)->wait();

  // This member's chunk: the members' compressed values averaged, compressed again.
  at::Tensor averaged = unpack_signs(signs)
                            .view({size, chunk})
                            .mul_(scales.view({size, 1}))
                            .sum(0)
                            .div_(static_cast<double>(size));
  averaged.add_(errors.server);
  const at::Tensor server_scale = compress(averaged, errors.server, positive);
  at::Tensor all_signs = at::empty({padded / 8}, options.dtype(at::kByte));
  group.all_gather(pack_bits(positive), all_signs)->wait();
  at::Tensor server_scales = at::empty({size}, options);
  group.all_gather(server_scale, server_scales)->wait();

  const at::Tensor result =
      unpack_signs(all_signs).view({size, chunk}).mul_(server_scales.view({size, 1}));
  tensor.view({-1}).copy_(result.view({-1}).narrow(0, 0, n));
}

}  // namespace shardtrain
