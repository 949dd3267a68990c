#include "model/blockwise_attention.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace shardtrain::detail {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();
// fp32 scores per block the default block sizes aim at: 4M elements, 16 MiB. Backward holds
// four such tensors at once (scores, probabilities, their gradient, and a product's temporary).
constexpr int64_t kScoreBlockElements = int64_t{4} << 20;
// At most this many queries and keys per block: small enough that causal attention skips most
// of the blocks above the diagonal (a block of queries spanning the sequence would skip none).
constexpr int64_t kMaxBlock = 1024;

// The mask's positions on the host, to decide per block whether it needs masking at all.
struct BlockPlan {
  std::vector<int64_t> query_positions, key_positions;
  int64_t query_block = 0, key_block = 0;
  bool packed = false;
  bool causal = true;

  BlockPlan(const at::Tensor& q, const at::Tensor& k, const AttentionMask& mask,
            AttentionBlocks blocks) {
    auto host = [](const at::Tensor& t) {
      const at::Tensor c = t.to(at::kCPU, at::kLong).contiguous();
      return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
    };
    query_positions = host(mask.query_positions);
    key_positions = host(mask.key_positions);
    if (static_cast<int64_t>(query_positions.size()) != q.size(2) ||
        static_cast<int64_t>(key_positions.size()) != k.size(2)) {
      throw std::invalid_argument("blockwise attention: " + std::to_string(q.size(2)) +
                                  " queries and " + std::to_string(k.size(2)) +
                                  " keys, but the mask has " +
                                  std::to_string(query_positions.size()) + " and " +
                                  std::to_string(key_positions.size()) + " positions");
    }
    packed = mask.query_segments.defined();
    causal = mask.is_causal;
    const int64_t tq = q.size(2), tk = k.size(2);
    key_block = blocks.keys > 0 ? blocks.keys : std::min(tk, kMaxBlock);
    const int64_t rows = q.size(0) * q.size(1);
    query_block = blocks.queries > 0
                      ? blocks.queries
                      : std::clamp(kScoreBlockElements / std::max<int64_t>(1, rows * key_block),
                                   int64_t{16}, kMaxBlock);
    query_block = std::max<int64_t>(1, std::min(query_block, tq));
    key_block = std::max<int64_t>(1, std::min(key_block, tk));
  }

  // 0: no query of the block may read a key of the other; 1: every one may (before samples);
  // 2: some may.
  int coverage(int64_t q0, int64_t qn, int64_t k0, int64_t kn) const {
    if (!causal) return 1;
    const auto [qmin, qmax] =
        std::minmax_element(query_positions.begin() + q0, query_positions.begin() + q0 + qn);
    const auto [kmin, kmax] =
        std::minmax_element(key_positions.begin() + k0, key_positions.begin() + k0 + kn);
    if (*kmin > *qmax) return 0;
    return *kmax <= *qmin ? 1 : 2;
  }
};

// [B, 1, 1, qn, kn] or [qn, kn]: true where the block's query may read the block's key.
at::Tensor allowed_in_block(const AttentionMask& mask, int coverage, int64_t q0, int64_t qn,
                            int64_t k0, int64_t kn) {
  at::Tensor allowed;
  if (coverage == 2) {
    allowed = mask.key_positions.narrow(0, k0, kn).unsqueeze(0) <=
              mask.query_positions.narrow(0, q0, qn).unsqueeze(1);
  }
  if (!mask.query_segments.defined()) return allowed;
  const at::Tensor qs = mask.query_segments.narrow(1, q0, qn);
  const at::Tensor ks = mask.key_segments.narrow(1, k0, kn);
  at::Tensor same = (qs.unsqueeze(2) == ks.unsqueeze(1)).unsqueeze(1).unsqueeze(1);
  return allowed.defined() ? same & allowed : same;
}

// q as [B, Hkv, G, Tq, D]: the G query heads that read each key/value head side by side, so
// a block's product broadcasts k over them instead of repeating it.
at::Tensor grouped(const at::Tensor& q, int64_t kv_heads) {
  if (q.size(1) % kv_heads != 0) {
    throw std::invalid_argument("blockwise attention: " + std::to_string(q.size(1)) +
                                " query heads are not a multiple of " + std::to_string(kv_heads) +
                                " key/value heads");
  }
  return q.view({q.size(0), kv_heads, q.size(1) / kv_heads, q.size(2), q.size(3)});
}

at::Tensor ungrouped(const at::Tensor& x) {
  auto sizes = x.sizes().vec();
  sizes[1] *= sizes[2];
  sizes.erase(sizes.begin() + 2);
  return x.reshape(sizes);
}

// The block's scaled scores [B, Hkv, G, qn, kn] in fp32, masked where not allowed.
at::Tensor block_scores(const at::Tensor& qi, const at::Tensor& kj, const AttentionMask& mask,
                        int coverage, int64_t q0, int64_t qn, int64_t k0, int64_t kn) {
  at::Tensor s = at::matmul(qi, kj.transpose(-2, -1));
  const at::Tensor allowed = allowed_in_block(mask, coverage, q0, qn, k0, kn);
  if (allowed.defined()) s.masked_fill_(allowed.logical_not(), -kInfinity);
  return s;
}

// Blocks are computed in fp32, or in double for double inputs.
at::ScalarType compute_dtype(const at::Tensor& q) {
  return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

}  // namespace

AttentionMask AttentionMask::causal(int64_t length) {
  AttentionMask mask;
  mask.query_positions = at::arange(length, at::kLong);
  mask.key_positions = mask.query_positions;
  return mask;
}

AttentionPart attention_part(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const AttentionMask& mask, AttentionBlocks blocks) {
  const at::NoGradGuard no_grad;
  const BlockPlan plan(q, k, mask, blocks);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  const at::Tensor q5 = grouped(q, k.size(1));
  const at::Tensor k5 = k.unsqueeze(2), v5 = v.unsqueeze(2);
  const int64_t tq = q.size(2), tk = k.size(2);
  const at::ScalarType dtype = compute_dtype(q);
  const auto options = q.options().dtype(dtype);
  at::Tensor out = at::empty(q5.sizes(), options);
  at::Tensor lse = at::empty(q5.sizes().slice(0, 4), options);
  for (int64_t q0 = 0; q0 < tq; q0 += plan.query_block) {
    const int64_t qn = std::min(plan.query_block, tq - q0);
    const at::Tensor qi = q5.narrow(3, q0, qn).to(dtype) * scale;
    at::Tensor running_max = at::full(qi.sizes().slice(0, 4), -kInfinity, options);
    at::Tensor sum = at::zeros_like(running_max);
    at::Tensor acc = at::zeros_like(qi);
    for (int64_t k0 = 0; k0 < tk; k0 += plan.key_block) {
      const int64_t kn = std::min(plan.key_block, tk - k0);
      const int coverage = plan.coverage(q0, qn, k0, kn);
      if (coverage == 0) continue;
      const at::Tensor s =
          block_scores(qi, k5.narrow(3, k0, kn).to(dtype), mask, coverage, q0, qn, k0, kn);
      const at::Tensor new_max = at::maximum(running_max, std::get<0>(s.max(-1)));
      // A row with nothing allowed yet keeps max -inf; shifting by 0 keeps its exps 0, not NaN.
      const at::Tensor shift = new_max.masked_fill(new_max == -kInfinity, 0.0);
      const at::Tensor p = (s - shift.unsqueeze(-1)).exp_();
      const at::Tensor rescale = (running_max - shift).exp_();
      sum = sum * rescale + p.sum(-1);
      acc = acc * rescale.unsqueeze(-1) + at::matmul(p, v5.narrow(3, k0, kn).to(dtype));
      running_max = new_max;
    }
    // A row that read nothing has sum 0 and acc 0: out 0, and lse log(0) + (-inf) = -inf.
    const at::Tensor divisor = sum.clamp_min(std::numeric_limits<float>::min());
    out.narrow(3, q0, qn).copy_(acc / divisor.unsqueeze(-1));
    lse.narrow(3, q0, qn).copy_(running_max.masked_fill(running_max == -kInfinity, 0.0) +
                                sum.log());
  }
  return {ungrouped(out), ungrouped(lse)};
}

void merge_attention_part(AttentionPart& into, const AttentionPart& part) {
  const at::NoGradGuard no_grad;
  const at::Tensor lse = at::logaddexp(into.lse, part.lse);
  // Rows that read nothing in either part stay out 0, lse -inf.
  const at::Tensor safe = lse.masked_fill(lse == -kInfinity, 0.0);
  into.out = into.out * (into.lse - safe).exp().unsqueeze(-1) +
             part.out * (part.lse - safe).exp().unsqueeze(-1);
  into.lse = lse;
}

AttentionGrads attention_part_backward(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, const at::Tensor& dout,
                                       const at::Tensor& lse, const at::Tensor& delta,
                                       const AttentionMask& mask, AttentionBlocks blocks) {
  const at::NoGradGuard no_grad;
  const BlockPlan plan(q, k, mask, blocks);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  const int64_t kv_heads = k.size(1);
  const at::Tensor q5 = grouped(q, kv_heads), do5 = grouped(dout, kv_heads);
  // A row that read nothing has lse -inf; +inf makes its probabilities exp(-inf) = 0.
  const at::Tensor lse_or_inf = lse.masked_fill(lse == -kInfinity, kInfinity);
  const at::Tensor lse5 = grouped(lse_or_inf.unsqueeze(-1), kv_heads).squeeze(-1);
  const at::Tensor delta5 = grouped(delta.unsqueeze(-1), kv_heads).squeeze(-1);
  const at::Tensor k5 = k.unsqueeze(2), v5 = v.unsqueeze(2);
  const int64_t tq = q.size(2), tk = k.size(2);
  const at::ScalarType dtype = compute_dtype(q);
  const auto options = q.options().dtype(dtype);
  at::Tensor dq = at::zeros(q5.sizes(), options);
  at::Tensor dk = at::zeros(k.sizes(), options), dv = at::zeros(v.sizes(), options);
  for (int64_t q0 = 0; q0 < tq; q0 += plan.query_block) {
    const int64_t qn = std::min(plan.query_block, tq - q0);
    const at::Tensor qi = q5.narrow(3, q0, qn).to(dtype) * scale;
    const at::Tensor doi = do5.narrow(3, q0, qn).to(dtype);
    const at::Tensor lse_i = lse5.narrow(3, q0, qn).unsqueeze(-1);
    const at::Tensor delta_i = delta5.narrow(3, q0, qn).unsqueeze(-1);
    at::Tensor dqi = dq.narrow(3, q0, qn);
    for (int64_t k0 = 0; k0 < tk; k0 += plan.key_block) {
      const int64_t kn = std::min(plan.key_block, tk - k0);
      const int coverage = plan.coverage(q0, qn, k0, kn);
      if (coverage == 0) continue;
      const at::Tensor kj = k5.narrow(3, k0, kn).to(dtype);
      const at::Tensor vj = v5.narrow(3, k0, kn).to(dtype);
      const at::Tensor p = (block_scores(qi, kj, mask, coverage, q0, qn, k0, kn) - lse_i).exp_();
      dv.narrow(2, k0, kn).add_(at::matmul(p.transpose(-2, -1), doi).sum(2));
      const at::Tensor ds = p.mul_(at::matmul(doi, vj.transpose(-2, -1)).sub_(delta_i));
      dqi.add_(at::matmul(ds, kj));
      // qi carries the scale already, so this is ds^T (q * scale).
      dk.narrow(2, k0, kn).add_(at::matmul(ds.transpose(-2, -1), qi).sum(2));
    }
  }
  return {ungrouped(dq.mul_(scale)), dk, dv};
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class BlockwiseAttentionFunction : public torch::autograd::Function<BlockwiseAttentionFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const AttentionMask& mask,
                            AttentionBlocks blocks) {
    AttentionPart part = attention_part(q, k, v, mask, blocks);
    at::Tensor out = part.out.to(q.scalar_type());
    ctx->save_for_backward({q, k, v, out, part.lse, mask.query_positions, mask.key_positions,
                            mask.query_segments, mask.key_segments});
    ctx->saved_data["query_block"] = blocks.queries;
    ctx->saved_data["key_block"] = blocks.keys;
    ctx->saved_data["causal"] = mask.is_causal;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3];
    AttentionMask mask;
    mask.query_positions = saved[5];
    mask.key_positions = saved[6];
    mask.query_segments = saved[7];
    mask.key_segments = saved[8];
    mask.is_causal = ctx->saved_data["causal"].toBool();
    const AttentionBlocks blocks{ctx->saved_data["query_block"].toInt(),
                                 ctx->saved_data["key_block"].toInt()};
    const at::Tensor dout = grad_outputs[0];
    const at::ScalarType dtype = compute_dtype(q);
    const at::Tensor delta = (dout.to(dtype) * out.to(dtype)).sum(-1);
    const AttentionGrads g = attention_part_backward(q, k, v, dout, saved[4], delta, mask, blocks);
    return {g.q.to(q.scalar_type()), g.k.to(k.scalar_type()), g.v.to(v.scalar_type()), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor blockwise_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const AttentionMask& mask, AttentionBlocks blocks) {
  return BlockwiseAttentionFunction::apply(q, k, v, mask, blocks);
}

}  // namespace shardtrain::detail
