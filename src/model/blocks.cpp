// Norms, MLPs, the pre-norm blocks of the decoders, BERT's post-norm block and its head.
#include "model/autocast.h"
#include "model/init.h"
#include "model/layers.h"
#include "shardtrain/lora.h"

namespace shardtrain::detail {

at::Tensor new_parameter(at::IntArrayRef shape, bool deferred) {
  at::Tensor p = at::empty(shape, at::kFloat);
  // Large blocks come from mmap, and untouched pages were never resident: describing even a
  // model larger than memory costs nothing.
  if (deferred) release_storage(p);
  return p;
}

LinearImpl::LinearImpl(int64_t in, int64_t out, bool bias, bool deferred) {
  weight = register_parameter("weight", new_parameter({out, in}, deferred));
  if (bias) this->bias = register_parameter("bias", new_parameter({out}, deferred));
}

at::Tensor LinearImpl::forward(const at::Tensor& x) {
  if (fp8 && is_training()) return fp8_linear(x, weight, bias, *fp8);
  if (compression) return quantized_forward(x);
  if (tp) return tensor_parallel_forward(x);
  // Packed NF4 always, and outside autocast (under it the product runs in the autocast dtype
  // whatever W's) a frozen W of another dtype, go through frozen_linear rather than a cast
  // autograd would keep.
  bool through_frozen = !nf4_shape.empty();
  if (!through_frozen && weight.scalar_type() != x.scalar_type() && !weight.requires_grad() &&
      !(bias.defined() && bias.requires_grad())) {
    const AutocastState autocast = autocast_state();
    through_frozen = !autocast.cpu && !autocast.cuda;
  }
  at::Tensor y =
      through_frozen ? frozen_linear(x, weight, bias, nf4_shape) : at::linear(x, weight, bias);
  if (!lora_a) return y;
  return y + lora_delta(x, lora_a->weight, lora_b->weight, lora_scale, lora_dropout, is_training());
}

// Quantization-aware training takes whole, trained weights: no split, adapter or frozen storage
// (TrainConfig::validate refuses them together).
at::Tensor LinearImpl::quantized_forward(const at::Tensor& x) {
  const at::Tensor w =
      compression->weights && weight_quant.bits > 0 ? fake_quantize(weight, weight_quant) : weight;
  const at::Tensor in =
      compression->activations && input_quant.bits > 0 ? fake_quantize_tokens(x, input_quant) : x;
  return at::linear(in, w, bias);
}

at::Tensor sequence_parallel_weight(const at::Tensor& weight,
                                    const std::shared_ptr<LayerSplit>& tp) {
  if (!tp || !tp->sequence_parallel_now || !weight.defined()) return weight;
  return tp->copy_in(weight);
}

at::Tensor column_parallel_input(const at::Tensor& x, const LayerSplit& tp) {
  return tp.sequence_parallel_now ? tp.gather_sequence(x) : tp.copy_in(x);
}

// Megatron-LM's split: a column-parallel layer takes the whole activation (its f: the input's
// gradient is summed across the group) and yields this rank's features; a row-parallel one
// takes those features and sums the partial products across the group (its g). Under sequence
// parallelism f and g become an all-gather and a reduce-scatter along the sequence.
at::Tensor LinearImpl::tensor_parallel_forward(const at::Tensor& x) {
  if (!tp_rowwise) return at::linear(column_parallel_input(x, *tp), weight, bias);
  const at::Tensor partial = at::linear(x, weight);
  const at::Tensor y =
      tp->sequence_parallel_now ? tp->reduce_scatter_sequence(partial) : tp->reduce_out(partial);
  // Under sequence parallelism the bias meets this rank's part of the sequence only.
  return bias.defined() ? y + sequence_parallel_weight(bias, tp) : y;
}

at::Tensor LayerNormImpl::forward(const at::Tensor& x) {
  return at::layer_norm(x, {weight.size(0)}, sequence_parallel_weight(weight, tp),
                        sequence_parallel_weight(bias, tp), eps_);
}

LayerNormImpl::LayerNormImpl(int64_t dim, double eps, bool deferred) : eps_(eps) {
  weight = register_parameter("weight", new_parameter({dim}, deferred));
  bias = register_parameter("bias", new_parameter({dim}, deferred));
}

EmbeddingImpl::EmbeddingImpl(int64_t count, int64_t dim, bool deferred) {
  weight = register_parameter("weight", new_parameter({count, dim}, deferred));
}

at::Tensor EmbeddingImpl::forward(const at::Tensor& ids) {
  if (compression && compression->weights && weight_quant.bits > 0) {
    return at::embedding(fake_quantize(weight, weight_quant), ids);  // never split (no tp)
  }
  if (!tp) return at::embedding(weight, ids);
  // This rank holds rows [start, start + rows): other ids look up row 0 and are zeroed, so the
  // sum across the group holds each id's one row.
  const int64_t rows = weight.size(0);
  const int64_t start = static_cast<int64_t>(tp->rank()) * rows;
  const at::Tensor other = (ids < start) | (ids >= start + rows);
  const at::Tensor local = at::embedding(weight, (ids - start).masked_fill(other, 0))
                               .masked_fill(other.unsqueeze(-1), 0.0);
  return tp->sequence_parallel_now ? tp->reduce_scatter_sequence(local) : tp->reduce_out(local);
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps, bool deferred) : eps_(eps) {
  weight = register_parameter("weight", new_parameter({dim}, deferred));
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  // As HF Llama: normalize in float32 even for half-precision activations, then scale in the
  // input dtype, so bf16 training matches the reference implementation.
  const at::Tensor wide = x.to(at::promote_types(x.scalar_type(), at::kFloat));
  const at::Tensor normed = wide * at::rsqrt(wide.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  return rms_norm(x, sequence_parallel_weight(weight, tp), eps_);
}

Gpt2MlpImpl::Gpt2MlpImpl(const ModelConfig& config, bool deferred)
    : approximate_(config.family == ModelFamily::kBert ? "none" : "tanh") {
  fc = register_module("fc", Linear(config.d_model, config.ffn_hidden, true, deferred));
  proj = register_module("proj", Linear(config.ffn_hidden, config.d_model, true, deferred));
}

at::Tensor Gpt2MlpImpl::forward(const at::Tensor& x) {
  return proj->forward(at::gelu(fc->forward(x), approximate_));
}

LlamaMlpImpl::LlamaMlpImpl(const ModelConfig& config, bool deferred)
    : LlamaMlpImpl(config.d_model, config.ffn_hidden, deferred) {}

LlamaMlpImpl::LlamaMlpImpl(int64_t d_model, int64_t hidden, bool deferred) {
  auto linear = [deferred](int64_t in, int64_t out) { return Linear(in, out, false, deferred); };
  gate = register_module("gate", linear(d_model, hidden));
  up = register_module("up", linear(d_model, hidden));
  down = register_module("down", linear(hidden, d_model));
}

at::Tensor LlamaMlpImpl::forward(const at::Tensor& x) {
  return down->forward(at::silu(gate->forward(x)) * up->forward(x));
}

namespace {

at::Tensor residual_dropout(const at::Tensor& x, double p, bool training) {
  return training && p > 0.0 ? at::dropout(x, p, /*train=*/true) : x;
}

// A residual branch times the block's scale (progressive layer dropping); untouched at 1.
at::Tensor scaled(const at::Tensor& branch, const BlockContext& ctx) {
  return ctx.residual_scale == 1.0 ? branch : branch * ctx.residual_scale;
}

}  // namespace

Gpt2BlockImpl::Gpt2BlockImpl(const ModelConfig& config, bool deferred) : dropout_(config.dropout) {
  ln1 = register_module("ln1", LayerNorm(config.d_model, config.norm_eps, deferred));
  attn = register_module("attn", Gpt2Attention(config, deferred));
  ln2 = register_module("ln2", LayerNorm(config.d_model, config.norm_eps, deferred));
  mlp = register_module("mlp", Gpt2Mlp(config, deferred));
}

at::Tensor Gpt2BlockImpl::forward(const at::Tensor& x, const BlockContext& ctx) {
  const at::Tensor h =
      x +
      scaled(residual_dropout(attn->forward(ln1->forward(x), ctx), dropout_, is_training()), ctx);
  return h + scaled(residual_dropout(mlp->forward(ln2->forward(h)), dropout_, is_training()), ctx);
}

BertBlockImpl::BertBlockImpl(const ModelConfig& config, bool deferred) : dropout_(config.dropout) {
  attn = register_module("attn", BertAttention(config, deferred));
  attn_norm = register_module("attn_norm", LayerNorm(config.d_model, config.norm_eps, deferred));
  mlp = register_module("mlp", Gpt2Mlp(config, deferred));
  mlp_norm = register_module("mlp_norm", LayerNorm(config.d_model, config.norm_eps, deferred));
}

at::Tensor BertBlockImpl::forward(const at::Tensor& x, const BlockContext& ctx) {
  const at::Tensor h = attn_norm->forward(
      x + scaled(residual_dropout(attn->forward(x, ctx), dropout_, is_training()), ctx));
  return mlp_norm->forward(h +
                           scaled(residual_dropout(mlp->forward(h), dropout_, is_training()), ctx));
}

MlmHeadImpl::MlmHeadImpl(const ModelConfig& config, bool deferred) {
  bias = register_parameter("bias", new_parameter({config.vocab_size}, deferred));
  dense = register_module("dense", Linear(config.d_model, config.d_model, true, deferred));
  norm = register_module("norm", LayerNorm(config.d_model, config.norm_eps, deferred));
}

at::Tensor MlmHeadImpl::forward(const at::Tensor& x) {
  // Under autocast the dense layer computes in bf16; the norm takes its input in the weights'
  // dtype (CPU autocast has no LayerNorm policy; CUDA's computes it in fp32).
  const at::Tensor h = at::gelu(dense->forward(x), "none");
  return norm->forward(h.to(norm->weight.scalar_type()));
}

LlamaBlockImpl::LlamaBlockImpl(const ModelConfig& config, int64_t layer, bool deferred,
                               int64_t first_expert, int64_t experts)
    : dropout_(config.dropout) {
  attn_norm = register_module("attn_norm", RMSNorm(config.d_model, config.norm_eps, deferred));
  attn = register_module("attn", LlamaAttention(config, deferred));
  ffn_norm = register_module("ffn_norm", RMSNorm(config.d_model, config.norm_eps, deferred));
  if (config.moe()) {
    moe = register_module("moe", Moe(config, layer, deferred, first_expert, experts));
  } else {
    mlp = register_module("mlp", LlamaMlp(config, deferred));
  }
}

at::Tensor LlamaBlockImpl::forward(const at::Tensor& x, const BlockContext& ctx) {
  const at::Tensor h = x + scaled(residual_dropout(attn->forward(attn_norm->forward(x), ctx),
                                                   dropout_, is_training()),
                                  ctx);
  const at::Tensor normed = ffn_norm->forward(h);
  const at::Tensor ffn = moe ? moe->forward(normed, ctx.moe) : mlp->forward(normed);
  return h + scaled(residual_dropout(ffn, dropout_, is_training()), ctx);
}

std::shared_ptr<BlockImpl> make_block(const ModelConfig& config, int64_t layer, bool deferred,
                                      const ModelParts& parts) {
  if (config.family == ModelFamily::kGpt2) {
    return std::make_shared<Gpt2BlockImpl>(config, deferred);
  }
  if (config.family == ModelFamily::kBert) return std::make_shared<BertBlockImpl>(config, deferred);
  return std::make_shared<LlamaBlockImpl>(config, layer, deferred, parts.first_expert,
                                          parts.experts);
}

}  // namespace shardtrain::detail
