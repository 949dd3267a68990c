// The blockwise attention kernel equals attention written out (the [T x T] scores, the mask, a
// softmax) in its output and in the gradients of q, k and v, in fp32 within 1e-5 relative: for
// causal and packed masks, grouped-query heads, odd lengths and blocks that do not divide
// them. Parts over disjoint keys, merged by their log-sum-exps, equal the whole, which is what
// context parallelism's ring relies on.
#include "model/blockwise_attention.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace shardtrain::detail {
namespace blockwise_attention_test {

struct Inputs {
  at::Tensor q, k, v, dout;
};

Inputs random_inputs(int64_t batch, int64_t heads, int64_t kv_heads, int64_t length,
                     int64_t head_dim) {
  Inputs in;
  in.q = at::randn({batch, heads, length, head_dim}).requires_grad_();
  in.k = at::randn({batch, kv_heads, length, head_dim}).requires_grad_();
  in.v = at::randn({batch, kv_heads, length, head_dim}).requires_grad_();
  in.dout = at::randn({batch, heads, length, head_dim});
  return in;
}

// [B, 1, Tq, Tk] (or [Tq, Tk]) true where the query may read the key.
at::Tensor allowed_matrix(const AttentionMask& mask) {
  at::Tensor allowed =
      mask.is_causal
          ? mask.key_positions.unsqueeze(0) <= mask.query_positions.unsqueeze(1)
          : at::ones({mask.query_positions.size(0), mask.key_positions.size(0)}, at::kBool);
  if (!mask.query_segments.defined()) return allowed;
  const at::Tensor same = mask.query_segments.unsqueeze(2) == mask.key_segments.unsqueeze(1);
  return (same & allowed).unsqueeze(1);
}

at::Tensor reference_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const AttentionMask& mask) {
  const int64_t group = q.size(1) / k.size(1);
  const at::Tensor kr = k.repeat_interleave(group, 1), vr = v.repeat_interleave(group, 1);
  const at::Tensor scores = at::matmul(q, kr.transpose(-2, -1)) / std::sqrt(double(q.size(-1)));
  const at::Tensor masked = scores.masked_fill(allowed_matrix(mask).logical_not(),
                                               -std::numeric_limits<double>::infinity());
  return at::matmul(at::softmax(masked, -1), vr);
}

// Relative to the largest value, or absolute where every value is below 1 (the gradients of q
// and k are zero for a single key).
double relative_error(const at::Tensor& got, const at::Tensor& want) {
  return (got - want).abs().max().item<double>() / std::max(1.0, want.abs().max().item<double>());
}

// Output and gradients of the blockwise kernel against the reference, for `blocks`.
void expect_equal_to_reference(const Inputs& in, const AttentionMask& mask, AttentionBlocks blocks,
                               const std::string& what) {
  const at::Tensor want = reference_attention(in.q, in.k, in.v, mask);
  const auto want_grads = torch::autograd::grad({want}, {in.q, in.k, in.v}, {in.dout});
  const at::Tensor got = blockwise_attention(in.q, in.k, in.v, mask, blocks);
  const auto got_grads = torch::autograd::grad({got}, {in.q, in.k, in.v}, {in.dout});
  EXPECT_LT(relative_error(got, want), 1e-5) << what << ": output";
  const char* names[] = {"dq", "dk", "dv"};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_LT(relative_error(got_grads[i], want_grads[i]), 1e-5) << what << ": " << names[i];
  }
}

const AttentionBlocks kBlockChoices[] = {{0, 0}, {7, 5}, {1, 64}, {64, 1}};

TEST(BlockwiseAttention, CausalEqualsTheReference) {
  torch::manual_seed(0);
  for (int64_t length : {1, 16, 37}) {
    const Inputs in = random_inputs(2, 4, 4, length, 8);
    for (const AttentionBlocks& blocks : kBlockChoices) {
      expect_equal_to_reference(in, AttentionMask::causal(length), blocks,
                                "length " + std::to_string(length) + " blocks " +
                                    std::to_string(blocks.queries) + "x" +
                                    std::to_string(blocks.keys));
    }
  }
}

TEST(BlockwiseAttention, GroupedQueryHeadsEqualTheReference) {
  torch::manual_seed(1);
  for (int64_t kv_heads : {1, 2}) {
    const Inputs in = random_inputs(2, 6, kv_heads == 1 ? 3 : 2, 29, 16);
    for (const AttentionBlocks& blocks : kBlockChoices) {
      expect_equal_to_reference(in, AttentionMask::causal(29), blocks,
                                "kv heads " + std::to_string(in.k.size(1)));
    }
  }
}

// BERT's attention: every key of the sequence (of the sample, when packed), over several blocks.
TEST(BlockwiseAttention, BidirectionalEqualsTheReference) {
  torch::manual_seed(5);
  const int64_t length = 31;
  const Inputs in = random_inputs(2, 4, 4, length, 8);
  AttentionMask mask = AttentionMask::causal(length);
  mask.is_causal = false;
  for (const AttentionBlocks& blocks : kBlockChoices) {
    expect_equal_to_reference(in, mask, blocks, "bidirectional");
  }
  std::vector<int64_t> row0(12, 0);
  row0.insert(row0.end(), 19, 1);
  mask.query_segments = at::stack({at::tensor(row0), at::zeros({length}, at::kLong)});
  mask.key_segments = mask.query_segments;
  for (const AttentionBlocks& blocks : kBlockChoices) {
    expect_equal_to_reference(in, mask, blocks, "bidirectional, packed");
  }
}

TEST(BlockwiseAttention, PackedSamplesEqualTheReference) {
  torch::manual_seed(2);
  const int64_t length = 23;
  const Inputs in = random_inputs(2, 4, 2, length, 8);
  AttentionMask mask = AttentionMask::causal(length);
  // Row 0: samples of 5, 9 and 6 tokens, then 3 of padding (-1); row 1: one sample.
  std::vector<int64_t> row0;
  int64_t sample = 0;
  for (int64_t n : {5, 9, 6}) row0.insert(row0.end(), static_cast<size_t>(n), sample++);
  row0.insert(row0.end(), 3, -1);
  mask.query_segments = at::stack({at::tensor(row0), at::zeros({length}, at::kLong)});
  mask.key_segments = mask.query_segments;
  for (const AttentionBlocks& blocks : kBlockChoices) {
    expect_equal_to_reference(in, mask, blocks, "packed");
  }
}

TEST(BlockwiseAttention, PartsOverDisjointKeysMergeIntoTheWhole) {
  torch::manual_seed(3);
  const int64_t length = 24;
  const Inputs in = random_inputs(1, 4, 2, length, 8);
  // The load-balanced split context parallelism uses: the queries of chunks 1 and 2 of 4, the
  // keys of all four, visited in an order that starts with keys later than some queries.
  const at::Tensor q_positions = at::cat({at::arange(6, 12), at::arange(12, 18)});
  const at::Tensor q = in.q.detach().narrow(2, 6, 12), dout = in.dout.narrow(2, 6, 12);
  AttentionMask whole_mask;
  whole_mask.query_positions = q_positions;
  whole_mask.key_positions = at::arange(length);
  const AttentionPart whole = attention_part(q, in.k.detach(), in.v.detach(), whole_mask);
  AttentionPart merged;
  std::vector<std::pair<int64_t, int64_t>> chunks = {{18, 6}, {0, 6}, {12, 6}, {6, 6}};
  for (const auto& [first, count] : chunks) {
    AttentionMask mask = whole_mask;
    mask.key_positions = at::arange(first, first + count);
    const AttentionPart part = attention_part(q, in.k.detach().narrow(2, first, count),
                                              in.v.detach().narrow(2, first, count), mask, {5, 4});
    if (!merged.out.defined()) {
      merged = part;
    } else {
      merge_attention_part(merged, part);
    }
  }
  EXPECT_LT(relative_error(merged.out, whole.out), 1e-5);
  EXPECT_LT(relative_error(merged.lse, whole.lse), 1e-5);
  // Summed over the parts, each part's backward gives the whole's gradients.
  const at::Tensor delta = (dout * whole.out).sum(-1);
  const AttentionGrads want =
      attention_part_backward(q, in.k.detach(), in.v.detach(), dout, whole.lse, delta, whole_mask);
  at::Tensor dq = at::zeros_like(q), dk = at::zeros_like(in.k), dv = at::zeros_like(in.v);
  for (const auto& [first, count] : chunks) {
    AttentionMask mask = whole_mask;
    mask.key_positions = at::arange(first, first + count);
    const AttentionGrads g = attention_part_backward(q, in.k.detach().narrow(2, first, count),
                                                     in.v.detach().narrow(2, first, count), dout,
                                                     whole.lse, delta, mask, {5, 4});
    dq += g.q;
    dk.narrow(2, first, count).add_(g.k);
    dv.narrow(2, first, count).add_(g.v);
  }
  EXPECT_LT(relative_error(dq, want.q), 1e-5);
  EXPECT_LT(relative_error(dk, want.k), 1e-5);
  EXPECT_LT(relative_error(dv, want.v), 1e-5);
}

TEST(BlockwiseAttention, AQueryThatReadsNothingGetsZeroAndMinusInfinity) {
  const Inputs in = random_inputs(1, 2, 2, 4, 8);
  AttentionMask mask;
  mask.query_positions = at::arange(4);
  mask.key_positions = at::arange(4) + 2;  // queries 0 and 1 precede every key
  const AttentionPart part = attention_part(in.q.detach(), in.k.detach(), in.v.detach(), mask);
  EXPECT_TRUE(part.out.isfinite().all().item<bool>());
  EXPECT_EQ(part.out.narrow(2, 0, 2).abs().max().item<float>(), 0.0f);
  EXPECT_TRUE(part.lse.narrow(2, 0, 2).isneginf().all().item<bool>());
  EXPECT_TRUE(part.lse.narrow(2, 2, 2).isfinite().all().item<bool>());
}

}  // namespace blockwise_attention_test
}  // namespace shardtrain::detail
