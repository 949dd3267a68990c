// Causal self-attention of both families: the shared attention core (fused kernel or reference),
// rotary embeddings, and the GPT-2 (fused qkv) and Llama (grouped-query) projections around it.
#include <torch/version.h>

#include <cmath>
#include <limits>

#include "model/layers.h"

namespace shardtrain::detail {

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double dropout_p, bool use_sdpa) {
  if (use_sdpa) {
#if TORCH_VERSION_MAJOR >= 2
    return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, dropout_p,
                                            /*is_causal=*/true);
#else
    // 1.13 exposes the kernel only under its private name, returning (output, weights).
    return std::get<0>(at::_scaled_dot_product_attention(
        q, k, v, /*attn_mask=*/{}, dropout_p, /*need_attn_weights=*/false, /*is_causal=*/true));
#endif
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  const at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) * scale;
  const at::Tensor future =
      at::ones({q.size(-2), k.size(-2)}, q.options().dtype(at::kBool)).triu(/*diagonal=*/1);
  at::Tensor probs =
      at::softmax(scores.masked_fill(future, -std::numeric_limits<double>::infinity()), -1);
  if (dropout_p > 0.0) probs = at::dropout(probs, dropout_p, /*train=*/true);
  return at::matmul(probs, v);
}

std::pair<at::Tensor, at::Tensor> rope_tables(int64_t length, int64_t head_dim, double theta,
                                              const at::TensorOptions& options) {
  // Double precision keeps the angles of late positions (up to 8192 x 1 rad) exact before the
  // cast; HF computes them in float32, which differs by at most a rounding of the result.
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor exponents = at::arange(0, head_dim, 2, f64) / static_cast<double>(head_dim);
  const at::Tensor inv_freq = at::pow(theta, -exponents);
  const at::Tensor angles = at::outer(at::arange(length, f64), inv_freq);
  const at::Tensor full = at::cat({angles, angles}, -1);
  return {full.cos().to(options), full.sin().to(options)};
}

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

namespace {

// [B, T, heads * head_dim] -> [B, heads, T, head_dim]
at::Tensor split_heads(const at::Tensor& x, int64_t head_dim) {
  return x.view({x.size(0), x.size(1), x.size(2) / head_dim, head_dim}).transpose(1, 2);
}

// [B, heads, T, head_dim] -> [B, T, heads * head_dim]
at::Tensor merge_heads(const at::Tensor& x) {
  return x.transpose(1, 2).contiguous().view({x.size(0), x.size(2), x.size(1) * x.size(3)});
}

}  // namespace

Gpt2AttentionImpl::Gpt2AttentionImpl(const ModelConfig& config, bool deferred)
    : head_dim_(config.d_model / config.n_heads), dropout_(config.dropout) {
  const int64_t d = config.d_model;
  qkv = register_module("qkv", Linear(d, 3 * d, true, deferred));
  proj = register_module("proj", Linear(d, d, true, deferred));
}

at::Tensor Gpt2AttentionImpl::forward(const at::Tensor& x, const BlockContext& ctx) {
  const auto parts = qkv->forward(x).chunk(3, -1);
  const at::Tensor out = causal_attention(
      split_heads(parts[0], head_dim_), split_heads(parts[1], head_dim_),
      split_heads(parts[2], head_dim_), is_training() ? dropout_ : 0.0, ctx.use_sdpa);
  return proj->forward(merge_heads(out));
}

LlamaAttentionImpl::LlamaAttentionImpl(const ModelConfig& config, bool deferred)
    : head_dim_(config.d_model / config.n_heads), dropout_(config.dropout) {
  const int64_t d = config.d_model;
  const int64_t kv_width = config.n_kv_heads * (d / config.n_heads);
  auto linear = [deferred](int64_t in, int64_t out) { return Linear(in, out, false, deferred); };
  q = register_module("q", linear(d, d));
  k = register_module("k", linear(d, kv_width));
  v = register_module("v", linear(d, kv_width));
  o = register_module("o", linear(d, d));
}

at::Tensor LlamaAttentionImpl::forward(const at::Tensor& x, const BlockContext& ctx) {
  const at::Tensor queries =
      apply_rope(split_heads(q->forward(x), head_dim_), ctx.rope_cos, ctx.rope_sin);
  at::Tensor keys = apply_rope(split_heads(k->forward(x), head_dim_), ctx.rope_cos, ctx.rope_sin);
  at::Tensor values = split_heads(v->forward(x), head_dim_);
  if (keys.size(1) != queries.size(1)) {
    // Query head h reads key/value head h / group, as HF's repeat_kv: expand, then fold the group
    // into the head axis (a copy, which the attention kernels need anyway). Split by heads,
    // a rank holds whole groups: its query heads and the key/value heads they read.
    const int64_t group = queries.size(1) / keys.size(1);
    auto repeat = [&](const at::Tensor& t) {
      const auto s = t.sizes();
      return t.unsqueeze(2)
          .expand({s[0], s[1], group, s[2], s[3]})
          .reshape({s[0], s[1] * group, s[2], s[3]});
    };
    keys = repeat(keys);
    values = repeat(values);
  }
  const at::Tensor out =
      causal_attention(queries, keys, values, is_training() ? dropout_ : 0.0, ctx.use_sdpa);
  return o->forward(merge_heads(out));
}

}  // namespace shardtrain::detail
