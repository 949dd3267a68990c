// Attention computed block by block with an online softmax (FlashAttention's algorithm, Dao et
// al. 2022, and its backward as in FlashAttention-2): no [queries x keys] tensor exists beyond
// one block of each, so the memory of attention grows with the sequence, not its square. The
// forward also returns each query's log-sum-exp, which is all that backward keeps besides the
// output and which lets partial results over different keys be merged (context parallelism's
// ring attention).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace shardtrain::detail {

// Which keys a query may read: those at a position no later than its own (every one when not
// `is_causal`) and, for packed samples, of the same sample. Positions are in the whole
// sequence, so a rank holding chunks of it (context parallelism) describes its queries and
// another rank's keys alike.
struct AttentionMask {
  at::Tensor query_positions;  // [Tq] int64
  at::Tensor key_positions;    // [Tk] int64
  at::Tensor query_segments;   // [B, Tq] int64 for packed samples; undefined: one sample per row
  at::Tensor key_segments;     // [B, Tk] int64, defined with query_segments
  bool is_causal = true;
  // Plain causality over [0, length).
  static AttentionMask causal(int64_t length);
};

// Rows of queries and of keys per block; 0 chooses them: at most 1024 each, fewer queries when
// the batch and head counts would make a block of scores more than 16 MiB of fp32.
struct AttentionBlocks {
  int64_t queries = 0;
  int64_t keys = 0;
};

// A result over some of the keys: out [B, H, Tq, D] and lse [B, H, Tq], both fp32 (double for
// double inputs). A query that may read none of the keys has out 0 and lse -inf.
struct AttentionPart {
  at::Tensor out;
  at::Tensor lse;
};

// softmax(q k^T / sqrt(D), masked) v without autograd. q [B, H, Tq, D]; k, v [B, Hkv, Tk, D]
// with H a multiple of Hkv (query head h reads key/value head h / (H / Hkv)).
AttentionPart attention_part(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const AttentionMask& mask, AttentionBlocks blocks = {});

// Merges `part` into `into` (the same queries over other keys) by their log-sum-exps.
void merge_attention_part(AttentionPart& into, const AttentionPart& part);

struct AttentionGrads {
  at::Tensor q, k, v;  // fp32 (double for double inputs), shaped as the inputs
};
// The gradients of one part's q, k, v given the whole attention's output gradient `dout`, its
// log-sum-exp `lse` over all the keys, and delta = rowsum(dout * out) [B, H, Tq]; summed over
// the parts, they are the gradients of the whole.
AttentionGrads attention_part_backward(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, const at::Tensor& dout,
                                       const at::Tensor& lse, const at::Tensor& delta,
                                       const AttentionMask& mask, AttentionBlocks blocks = {});

// Attention with autograd through the two functions above: the output in q's dtype; backward
// keeps q, k, v, the output and the log-sum-exp.
at::Tensor blockwise_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const AttentionMask& mask, AttentionBlocks blocks = {});

}  // namespace shardtrain::detail
