#include "dist/gloo_ring.h"

#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace shardtrain::detail {
namespace {

template <typename T>
void sum_fn(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<T*>(out);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = static_cast<T>(x[i] + y[i]);
}

template <typename T>
void max_fn(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<T*>(out);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = x[i] < y[i] ? y[i] : x[i];
}

// 16-bit floats are reduced in fp32 and rounded once per pairwise step, as NCCL does.
template <typename T>
void sum16_fn(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<T*>(out);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = T(static_cast<float>(x[i]) + static_cast<float>(y[i]));
}

template <typename T>
void max16_fn(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<T*>(out);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) {
    o[i] = static_cast<float>(x[i]) < static_cast<float>(y[i]) ? y[i] : x[i];
  }
}

// Gloo's unbound buffers bound the bytes in flight per send; 1 MiB segments keep two of them
// in flight per step while the previous one is reduced.
constexpr size_t kSegmentBytes = 1 << 20;
constexpr uint8_t kReduceScatterSlotPrefix = 0x70;

}  // namespace

ReduceFn reduce_fn(at::ScalarType dtype, ReduceOp op) {
  const bool max = op == ReduceOp::kMax;
  switch (dtype) {
    case at::kFloat:
      return max ? max_fn<float> : sum_fn<float>;
    case at::kDouble:
      return max ? max_fn<double> : sum_fn<double>;
    case at::kBFloat16:
      return max ? max16_fn<c10::BFloat16> : sum16_fn<c10::BFloat16>;
    case at::kHalf:
      return max ? max16_fn<c10::Half> : sum16_fn<c10::Half>;
    default:
      break;
  }
  TORCH_CHECK(op != ReduceOp::kAvg, "reduce op avg is not defined for dtype ", dtype,
              " (integer types have no exact average); use sum");
  switch (dtype) {
    case at::kInt:
      return max ? max_fn<int32_t> : sum_fn<int32_t>;
    case at::kLong:
      return max ? max_fn<int64_t> : sum_fn<int64_t>;
    case at::kByte:
      return max ? max_fn<uint8_t> : sum_fn<uint8_t>;
    default:
      TORCH_CHECK(false, "dtype ", dtype, " is not supported by the Gloo process group");
  }
  return nullptr;
}

void divide_in_place(at::Tensor& tensor, int64_t divisor) {
  if (divisor != 1) tensor.div_(static_cast<double>(divisor));
}

void ring_reduce_scatter(const std::shared_ptr<gloo::Context>& context, const void* input,
                         void* output, int64_t numel, size_t elem_size, ReduceFn fn, uint32_t tag,
                         std::chrono::milliseconds timeout) {
  const int size = context->size;
  const int rank = context->rank;
  const ShardRange mine = shard_range(numel, size, rank);
  const auto* in = static_cast<const char*>(input);
  if (size == 1) {
    std::memcpy(output, in + mine.offset * elem_size, mine.numel * elem_size);
    return;
  }
  const int right = (rank + 1) % size;
  const int left = (rank + size - 1) % size;
  const int64_t max_chunk = shard_range(numel, size, 0).numel;
  // Two chunk buffers alternate: one is being sent (the partial sum of the previous step)
  // while the next partial sum is received and accumulated into the other.
  std::vector<char> buffers[2] = {std::vector<char>(max_chunk * elem_size),
                                  std::vector<char>(max_chunk * elem_size)};
  std::unique_ptr<gloo::transport::UnboundBuffer> bound[2] = {
      context->createUnboundBuffer(buffers[0].data(), buffers[0].size()),
      context->createUnboundBuffer(buffers[1].data(), buffers[1].size())};
  // Step 0 sends straight from the input, which gloo only reads.
  auto input_buffer = context->createUnboundBuffer(const_cast<char*>(in), numel * elem_size);
  const uint64_t slot = gloo::Slot::build(kReduceScatterSlotPrefix, tag);
  const size_t segment_elems = std::max<size_t>(1, kSegmentBytes / elem_size);

  gloo::transport::UnboundBuffer* sending = nullptr;
  int sends_pending = 0;
  for (int step = 0; step < size - 1; ++step) {
    const ShardRange send_chunk = shard_range(numel, size, (rank - step - 1 + 2 * size) % size);
    const ShardRange recv_chunk = shard_range(numel, size, (rank - step - 2 + 2 * size) % size);
    // Post this step's sends: at step 0 the own input's chunk, later the partial sum.
    gloo::transport::UnboundBuffer* source = step == 0 ? input_buffer.get() : sending;
    const size_t source_offset = step == 0 ? send_chunk.offset * elem_size : 0;
    for (int64_t done = 0; done < send_chunk.numel; done += segment_elems) {
      const size_t n = std::min<int64_t>(segment_elems, send_chunk.numel - done);
      source->send(right, slot, source_offset + done * elem_size, n * elem_size);
      ++sends_pending;
    }
    gloo::transport::UnboundBuffer* target = bound[step % 2].get();
    for (int64_t done = 0; done < recv_chunk.numel; done += segment_elems) {
      const size_t n = std::min<int64_t>(segment_elems, recv_chunk.numel - done);
      target->recv(left, slot, done * elem_size, n * elem_size);
    }
    // Accumulate the own input's part segment by segment as each one lands; the last step
    // writes the finished shard straight into the output.
    const bool last = step == size - 2;
    char* accumulated = last ? static_cast<char*>(output) : static_cast<char*>(target->ptr);
    for (int64_t done = 0; done < recv_chunk.numel; done += segment_elems) {
      const size_t n = std::min<int64_t>(segment_elems, recv_chunk.numel - done);
      target->waitRecv(timeout);
      fn(accumulated + done * elem_size, static_cast<char*>(target->ptr) + done * elem_size,
         in + (recv_chunk.offset + done) * elem_size, n);
    }
    // The buffer sent in this step is received into two steps later: its sends must be done.
    for (; sends_pending > 0; --sends_pending) source->waitSend(timeout);
    sending = target;
  }
}

}  // namespace shardtrain::detail
