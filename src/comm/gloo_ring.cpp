#include "comm/gloo_ring.h"

#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
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

template <typename T>
void average_fn_of(void* out, const void* a, const void* b, size_t n, int64_t divisor) {
  auto* o = static_cast<T*>(out);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  const T d = static_cast<T>(divisor);
  for (size_t i = 0; i < n; ++i) o[i] = (x[i] + y[i]) / d;
}

// 16-bit floats: summed and divided in fp32, rounded once.
template <typename T>
void average16_fn(void* out, const void* a, const void* b, size_t n, int64_t divisor) {
  auto* o = static_cast<T*>(out);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  const float d = static_cast<float>(divisor);
  for (size_t i = 0; i < n; ++i) {
    o[i] = T((static_cast<float>(x[i]) + static_cast<float>(y[i])) / d);
  }
}

// Each segment is received, reduced and forwarded on its own, so the ring pipelines across
// steps. 4 MiB measured better than 1 MiB here (per-message overhead on loopback TCP): median
// reduce_scatter/all_reduce busbw 0.91 against 0.82 at 64 MiB on 4 ranks.
constexpr size_t kSegmentBytes = 4 << 20;
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

AverageFn average_fn(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return average_fn_of<float>;
    case at::kDouble:
      return average_fn_of<double>;
    case at::kBFloat16:
      return average16_fn<c10::BFloat16>;
    case at::kHalf:
      return average16_fn<c10::Half>;
    default:
      break;
  }
  TORCH_CHECK(false, "reduce op avg is not defined for dtype ", dtype,
              " (integer types have no exact average); use sum");
  return nullptr;
}

void ring_reduce_scatter(const std::shared_ptr<gloo::Context>& context, const void* input,
                         void* output, int64_t numel, size_t elem_size, ReduceFn fn,
                         AverageFn average, uint32_t tag, std::chrono::milliseconds timeout,
                         std::vector<char>& workspace) {
  const int size = context->size;
  const int rank = context->rank;
  const ShardRange mine = shard_range(numel, size, rank);
  const auto* in = static_cast<const char*>(input);
  if (size == 1) {
    std::memmove(output, in + mine.offset * elem_size, mine.numel * elem_size);
    return;
  }
  const int right = (rank + 1) % size;
  const int left = (rank + size - 1) % size;
  const int64_t max_chunk = shard_range(numel, size, 0).numel;
  const uint64_t slot = gloo::Slot::build(kReduceScatterSlotPrefix, tag);
  const int64_t segment = std::max<int64_t>(1, kSegmentBytes / elem_size);
  auto segment_count = [&](int64_t done, int64_t total) {
    return static_cast<size_t>(std::min(segment, total - done));
  };

  // Two chunk buffers alternate: step s receives and accumulates into buffer s % 2, and each
  // segment goes on to the right neighbour (as step s+1's send) as soon as it is accumulated,
  // so the ring stays pipelined across steps. Index 2 is the input, which step 0 sends from.
  // (Two ranks have one step, which uses only the first.)
  const size_t chunk_bytes = max_chunk * elem_size;
  const size_t workspace_bytes = (size == 2 ? 1 : 2) * chunk_bytes;
  if (workspace.size() < workspace_bytes) workspace.resize(workspace_bytes);
  std::unique_ptr<gloo::transport::UnboundBuffer> buffers[3] = {
      context->createUnboundBuffer(workspace.data(), chunk_bytes),
      context->createUnboundBuffer(workspace.data() + (size == 2 ? 0 : chunk_bytes), chunk_bytes),
      context->createUnboundBuffer(const_cast<char*>(in), numel * elem_size)};
  int pending_sends[3] = {0, 0, 0};
  auto wait_sends = [&](int index) {
    for (; pending_sends[index] > 0; --pending_sends[index]) {
      try {
        buffers[index]->waitSend(timeout);
      } catch (const std::exception& e) {
        throw PeerError(right, false, e.what());
      }
    }
  };

  const ShardRange first = shard_range(numel, size, (rank + size - 1) % size);
  for (int64_t done = 0; done < first.numel; done += segment) {
    buffers[2]->send(right, slot, (first.offset + done) * elem_size,
                     segment_count(done, first.numel) * elem_size);
    ++pending_sends[2];
  }
  for (int step = 0; step < size - 1; ++step) {
    const ShardRange chunk = shard_range(numel, size, (rank - step - 2 + 2 * size) % size);
    const int index = step % 2;
    gloo::transport::UnboundBuffer& target = *buffers[index];
    // This buffer was forwarded two steps ago: those sends must be out before it is reused.
    wait_sends(index);
    for (int64_t done = 0; done < chunk.numel; done += segment) {
      target.recv(left, slot, done * elem_size, segment_count(done, chunk.numel) * elem_size);
    }
    // The last step writes the finished shard straight into the output.
    const bool last = step == size - 2;
    char* accumulated = last ? static_cast<char*>(output) : static_cast<char*>(target.ptr);
    for (int64_t done = 0; done < chunk.numel; done += segment) {
      const size_t n = segment_count(done, chunk.numel);
      try {
        target.waitRecv(timeout);
      } catch (const std::exception& e) {
        // Gloo names only its socket; the peer that sent nothing is what the user needs.
        throw PeerError(left, true, e.what());
      }
      char* into = accumulated + done * elem_size;
      const char* received = static_cast<char*>(target.ptr) + done * elem_size;
      const char* own = in + (chunk.offset + done) * elem_size;
      if (last && average) {
        average(into, received, own, n, size);
      } else {
        fn(into, received, own, n);
      }
      if (!last) {
        target.send(right, slot, done * elem_size, n * elem_size);
        ++pending_sends[index];
      }
    }
  }
  for (int index = 0; index < 3; ++index) wait_sends(index);
}

}  // namespace shardtrain::detail
