// 1-bit compressed averaging with error feedback (shardtrain/optimizers.h).
#include "comm/compressed_all_reduce.h"

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

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

// The CPU's passes, fused: one over x for its norm, one packing the signs and updating the
// error. x may alias nothing else.
float compress_cpu(const float* x, int64_t numel, float* error, uint8_t* packed) {
  double sum = 0;
  for (int64_t i = 0; i < numel; ++i) sum += static_cast<double>(x[i]) * x[i];
  const float scale = static_cast<float>(std::sqrt(sum / static_cast<double>(numel)));
  for (int64_t b = 0; b < numel / 8; ++b) {
    uint8_t bits = 0;
    for (int k = 0; k < 8; ++k) {
      const int64_t i = 8 * b + k;
      const bool positive = x[i] >= 0;
      bits = static_cast<uint8_t>(bits | (positive << (7 - k)));
      error[i] = x[i] - (positive ? scale : -scale);
    }
    packed[b] = bits;
  }
  return scale;
}

// `out` (8 x bytes) += each bit as +weight or -weight.
void add_signs(const uint8_t* packed, int64_t bytes, float weight, float* out) {
  for (int64_t b = 0; b < bytes; ++b) {
    const uint8_t bits = packed[b];
    for (int k = 0; k < 8; ++k) out[8 * b + k] += (bits >> (7 - k)) & 1 ? weight : -weight;
  }
}

// compressed_all_reduce on the CPU: the same steps with the element passes fused.
void compressed_all_reduce_cpu(ProcessGroup& group, at::Tensor& tensor, CompressionErrors& errors,
                               int64_t padded, int64_t chunk) {
  const int64_t size = group.size(), n = tensor.numel();
  const auto options = tensor.options();
  at::Tensor buffer = at::empty({padded}, options);
  float* x = buffer.data_ptr<float>();
  const float* in = tensor.data_ptr<float>();
  float* worker_error = errors.worker.data_ptr<float>();
  for (int64_t i = 0; i < padded; ++i) x[i] = (i < n ? in[i] : 0.0f) + worker_error[i];
  at::Tensor packed = at::empty({padded / 8}, options.dtype(at::kByte));
  at::Tensor scale = at::empty({1}, options);
  scale.data_ptr<float>()[0] = compress_cpu(x, padded, worker_error, packed.data_ptr<uint8_t>());
  at::Tensor signs = at::empty({padded / 8}, options.dtype(at::kByte));
  group.all_to_all(packed, signs, {}, {})->wait();
  at::Tensor scales = at::empty({size}, options);
  group.all_gather(scale, scales)->wait();

  // This member's chunk: every member's signs times its scale, averaged, plus the carried error.
  at::Tensor averaged = errors.server.clone();
  float* avg = averaged.data_ptr<float>();
  for (int64_t r = 0; r < size; ++r) {
    add_signs(signs.data_ptr<uint8_t>() + r * chunk / 8, chunk / 8,
              scales.data_ptr<float>()[r] / static_cast<float>(size), avg);
  }
  at::Tensor server_packed = at::empty({chunk / 8}, options.dtype(at::kByte));
  at::Tensor server_scale = at::empty({1}, options);
  server_scale.data_ptr<float>()[0] =
      compress_cpu(avg, chunk, errors.server.data_ptr<float>(), server_packed.data_ptr<uint8_t>());
  at::Tensor all_signs = at::empty({padded / 8}, options.dtype(at::kByte));
  group.all_gather(server_packed, all_signs)->wait();
  at::Tensor server_scales = at::empty({size}, options);
  group.all_gather(server_scale, server_scales)->wait();

  at::Tensor result = at::zeros({padded}, options);
  for (int64_t r = 0; r < size; ++r) {
    add_signs(all_signs.data_ptr<uint8_t>() + r * chunk / 8, chunk / 8,
              server_scales.data_ptr<float>()[r], result.data_ptr<float>() + r * chunk);
  }
  tensor.view({-1}).copy_(result.narrow(0, 0, n));
}

}  // namespace

namespace {

struct Layout {
  int64_t padded;  // the tensor's numel rounded up: each member's chunk packs into whole bytes
  int64_t chunk;   // padded / size
};

// Checks the tensor and allocates the errors on the first call.
Layout prepare(ProcessGroup& group, const at::Tensor& tensor, CompressionErrors& errors) {
  if (tensor.scalar_type() != at::kFloat || !tensor.is_contiguous()) {
    throw std::invalid_argument("compressed_all_reduce: the tensor must be contiguous fp32, got " +
                                std::string(c10::toString(tensor.scalar_type())));
  }
  const int64_t unit = 8 * static_cast<int64_t>(group.size());
  const int64_t padded = (tensor.numel() + unit - 1) / unit * unit;
  const int64_t chunk = padded / group.size();
  if (!errors.worker.defined()) {
    errors.worker = at::zeros({padded}, tensor.options());
    errors.server = at::zeros({chunk}, tensor.options());
  }
  if (errors.worker.numel() != padded || errors.server.numel() != chunk) {
    throw std::invalid_argument(
        "compressed_all_reduce: the carried errors are for another tensor size or group (" +
        std::to_string(errors.worker.numel()) + " elements, expected " + std::to_string(padded) +
        ")");
  }
  return {padded, chunk};
}

}  // namespace

void compressed_all_reduce(ProcessGroup& group, at::Tensor tensor, CompressionErrors& errors) {
  if (tensor.numel() == 0) return;  // the same on every member: nothing to send
  const Layout layout = prepare(group, tensor, errors);
  if (!tensor.device().is_cpu())
    return detail::compressed_all_reduce_by_tensor_ops(group, tensor, errors);
  compressed_all_reduce_cpu(group, tensor, errors, layout.padded, layout.chunk);
}

void detail::compressed_all_reduce_by_tensor_ops(ProcessGroup& group, at::Tensor tensor,
                                                 CompressionErrors& errors) {
  const auto [padded, chunk] = prepare(group, tensor, errors);
  const int64_t size = group.size();
  const int64_t n = tensor.numel();
  const auto options = tensor.options();
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
