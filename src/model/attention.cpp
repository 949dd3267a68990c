// Self-attention of the three families: the shared attention core (blockwise, fused or
// reference; causal in the decoders), rotary embeddings, and the GPT-2 (fused qkv), Llama
// (grouped-query) and BERT projections around it.
#include <torch/version.h>

#include <cmath>
#include <limits>
#include <stdexcept>

#include "model/layers.h"

namespace shardtrain::detail {

namespace {

// Attention whose mask is not plain causality (packed samples): 0 where allowed, -inf elsewhere,
// added to the scores. Every query may attend at least to itself, so no row is all -inf.
at::Tensor masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double dropout_p, bool use_sdpa, const at::Tensor& allowed) {
  const at::Tensor bias =
      at::zeros(allowed.sizes(), q.options())
          .masked_fill(allowed.logical_not(), -std::numeric_limits<double>::infinity());
  if (use_sdpa) {
#if TORCH_VERSION_MAJOR >= 2
    return at::scaled_dot_product_attention(q, k, v, bias, dropout_p, /*is_causal=*/false);
#else
    return std::get<0>(at::_scaled_dot_product_attention(
        q, k, v, bias, dropout_p, /*need_attn_weights=*/false, /*is_causal=*/false));
#endif
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  at::Tensor probs = at::softmax(at::matmul(q, k.transpose(-2, -1)) * scale + bias, -1);
  if (dropout_p > 0.0) probs = at::dropout(probs, dropout_p, /*train=*/true);
  return at::matmul(probs, v);
}

// Query head h reads key/value head h / group, as Hugging Face's repeat_kv: expanded, then the
// group folded into the head axis (a copy, which the fused and reference kernels need anyway).
// Split by heads across tensor-parallel ranks, a rank holds whole groups.
at::Tensor repeat_kv(const at::Tensor& t, int64_t group) {
  if (group == 1) return t;
  const auto s = t.sizes();
  return t.unsqueeze(2)
      .expand({s[0], s[1], group, s[2], s[3]})
      .reshape({s[0], s[1] * group, s[2], s[3]});
}

}  // namespace

at::Tensor self_attention(const at::Tensor& q, const at::Tensor& k_heads, const at::Tensor& v_heads,
                          double dropout_p, const BlockContext& ctx) {
  if (ctx.attention == AttentionKernel::kBlockwise) {
    if (dropout_p > 0.0) {
      throw std::invalid_argument(
          "the blockwise attention kernel takes no attention dropout; set model.dropout = 0 or "
          "train.attention = \"fused\"");
    }
    if (ctx.cp) return ctx.cp->attention(q, k_heads, v_heads, ctx.mask, ctx.all_segments);
    return blockwise_attention(q, k_heads, v_heads, ctx.mask);
  }
  const int64_t group = q.size(1) / k_heads.size(1);
  const at::Tensor k = repeat_kv(k_heads, group), v = repeat_kv(v_heads, group);
  const bool use_sdpa = ctx.attention == AttentionKernel::kFused;
  if (ctx.allowed.defined()) return masked_attention(q, k, v, dropout_p, use_sdpa, ctx.allowed);
  if (use_sdpa) {
#if TORCH_VERSION_MAJOR >= 2
    return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, dropout_p,
                                            /*is_causal=*/ctx.causal);
#else
    // 1.13 exposes the kernel only under its private name, returning (output, weights).
    return std::get<0>(at::_scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, dropout_p,
                                                         /*need_attn_weights=*/false,
                                                         /*is_causal=*/ctx.causal));
#endif
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) * scale;
  if (ctx.causal) {
    const at::Tensor future =
        at::ones({q.size(-2), k.size(-2)}, q.options().dtype(at::kBool)).triu(/*diagonal=*/1);
    scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
  }
  at::Tensor probs = at::softmax(scores, -1);
  if (dropout_p > 0.0) probs = at::dropout(probs, dropout_p, /*train=*/true);
  return at::matmul(probs, v);
}

at::Tensor rope_inverse_frequencies(int64_t head_dim, double theta, const RopeScaling& scaling) {
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor exponents = at::arange(0, head_dim, 2, f64) / static_cast<double>(head_dim);
  const at::Tensor inv_freq = at::pow(theta, -exponents);
  if (!scaling.enabled()) return inv_freq;
  // Llama 3.1: wavelengths longer than the original context / low_freq_factor are stretched by
  // `factor`, those shorter than context / high_freq_factor kept, and those between blended
  // linearly in context / wavelength, so that long-range positions interpolate while local ones
  // stay as trained.
  const double context = static_cast<double>(scaling.original_context_length);
  const double low_wavelen = context / scaling.low_freq_factor;
  const double high_wavelen = context / scaling.high_freq_factor;
  const at::Tensor wavelen = 2.0 * M_PI / inv_freq;
  const at::Tensor smooth = (context / wavelen - scaling.low_freq_factor) /
                            (scaling.high_freq_factor - scaling.low_freq_factor);
  const at::Tensor blended = (1.0 - smooth) * inv_freq / scaling.factor + smooth * inv_freq;
  at::Tensor scaled = at::where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq);
  return at::where((wavelen >= high_wavelen) & (wavelen <= low_wavelen), blended, scaled);
}

std::pair<at::Tensor, at::Tensor> rope_tables(int64_t length, int64_t head_dim, double theta,
                                              const at::TensorOptions& options,
                                              const RopeScaling& scaling) {
  // Double precision keeps the angles of late positions (up to 8192 x 1 rad) exact before the
  // cast; HF computes them in float32, which differs by at most a rounding of the result.
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor inv_freq = rope_inverse_frequencies(head_dim, theta, scaling);
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
  const at::Tensor out =
      self_attention(split_heads(parts[0], head_dim_), split_heads(parts[1], head_dim_),
                     split_heads(parts[2], head_dim_), is_training() ? dropout_ : 0.0, ctx);
  return proj->forward(merge_heads(out));
}

HeadNormImpl::HeadNormImpl(int64_t head_dim, double eps, bool deferred) : eps_(eps) {
  weight = register_parameter("weight", new_parameter({head_dim}, deferred));
}

at::Tensor HeadNormImpl::forward(const at::Tensor& x, const std::shared_ptr<LayerSplit>& tp) {
  return rms_norm(x, tp ? tp->copy_in(weight) : weight, eps_);
}

LlamaAttentionImpl::LlamaAttentionImpl(const ModelConfig& config, bool deferred)
    : head_dim_(config.head_size()), dropout_(config.dropout) {
  const int64_t d = config.d_model;
  const int64_t q_width = config.n_heads * head_dim_;
  const int64_t kv_width = config.n_kv_heads * head_dim_;
  const bool bias = config.attention_bias;
  auto linear = [deferred](int64_t in, int64_t out, bool bias) {
    return Linear(in, out, bias, deferred);
  };
  q = register_module("q", linear(d, q_width, bias));
  k = register_module("k", linear(d, kv_width, bias));
  v = register_module("v", linear(d, kv_width, bias));
  o = register_module("o", linear(q_width, d, false));
  if (config.qk_norm) {
    q_norm = register_module("q_norm", HeadNorm(head_dim_, config.norm_eps, deferred));
    k_norm = register_module("k_norm", HeadNorm(head_dim_, config.norm_eps, deferred));
  }
}

at::Tensor LlamaAttentionImpl::forward(const at::Tensor& x, const BlockContext& ctx) {
  at::Tensor queries = split_heads(q->forward(x), head_dim_);
  at::Tensor keys = split_heads(k->forward(x), head_dim_);
  if (q_norm) {  // Qwen3 normalizes each head before the rotation
    queries = q_norm->forward(queries, q->tp);
    keys = k_norm->forward(keys, k->tp);
  }
  queries = apply_rope(queries, ctx.rope_cos, ctx.rope_sin);
  keys = apply_rope(keys, ctx.rope_cos, ctx.rope_sin);
  at::Tensor values = split_heads(v->forward(x), head_dim_);
  const at::Tensor out = self_attention(queries, keys, values, is_training() ? dropout_ : 0.0, ctx);
  return o->forward(merge_heads(out));
}

BertAttentionImpl::BertAttentionImpl(const ModelConfig& config, bool deferred)
    : head_dim_(config.head_size()), dropout_(config.dropout) {
  const int64_t d = config.d_model;
  q = register_module("q", Linear(d, d, true, deferred));
  k = register_module("k", Linear(d, d, true, deferred));
  v = register_module("v", Linear(d, d, true, deferred));
  o = register_module("o", Linear(d, d, true, deferred));
}

at::Tensor BertAttentionImpl::forward(const at::Tensor& x, const BlockContext& ctx) {
  const at::Tensor out =
      self_attention(split_heads(q->forward(x), head_dim_), split_heads(k->forward(x), head_dim_),
                     split_heads(v->forward(x), head_dim_), is_training() ? dropout_ : 0.0, ctx);
  return o->forward(merge_heads(out));
}

}  // namespace shardtrain::detail
