// Element-wise reductions for every supported dtype, and the ring reduce-scatter that Gloo's
// library lacks in a flat-buffer form, written on Gloo's unbound-buffer transport.
#pragma once

#include <gloo/context.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "shardtrain/dist.h"

namespace shardtrain::detail {

// out[i] = a[i] (op) b[i] for n elements; out may alias a or b. The signature is Gloo's.
using ReduceFn = void (*)(void* out, const void* a, const void* b, size_t n);
// Throws naming the dtype when it has no reduction (or no average, for integer types).
ReduceFn reduce_fn(at::ScalarType dtype, ReduceOp op);

// out[i] = (a[i] + b[i]) / divisor for n elements: the last step of a ring sum when the op is
// ReduceOp::kAvg, so the average costs no pass of its own. Throws for dtypes without an average.
using AverageFn = void (*)(void* out, const void* a, const void* b, size_t n, int64_t divisor);
AverageFn average_fn(at::ScalarType dtype);

// A transfer with one known peer (a rank of the group) that failed or timed out: the group names
// that peer and its host, which Gloo's own message leaves out.
struct PeerError : std::runtime_error {
  PeerError(int peer_rank, bool receiving, const std::string& what)
      : std::runtime_error(what), peer(peer_rank), receiving(receiving) {}
  int peer;
  bool receiving;
};

// Ring reduce-scatter of the flat `input` (numel elements of elem_size bytes) into `output`,
// which receives this rank's shard_range slice. Each rank sends and receives (size-1)/size of
// the input; chunks are split into segments so reducing one overlaps receiving the next.
// `workspace` (a window of four segments, and from three ranks one chunk for what is forwarded;
// grown, never shrunk) is reused across calls so that large reduce-scatters do not pay for
// allocating and faulting in fresh memory each time.
// With `average`, the last step reduces with it (dividing by the group size) instead of `fn`.
// `output` may be this rank's own slice of `input` (an in-place reduce-scatter).
// Runs on the calling thread and blocks until done; throws PeerError on a timeout.
void ring_reduce_scatter(const std::shared_ptr<gloo::Context>& context, const void* input,
                         void* output, int64_t numel, size_t elem_size, ReduceFn fn,
                         AverageFn average, uint32_t tag, std::chrono::milliseconds timeout,
                         std::vector<char>& workspace);

}  // namespace shardtrain::detail
