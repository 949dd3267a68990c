// Norms, MLPs and the pre-norm blocks of both families.
#include "model/layers.h"

namespace shardtrain::detail {

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", at::ones({dim}));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  // As HF Llama: normalize in float32 even for half-precision activations, then scale in the
  // input dtype, so bf16 training matches the reference implementation.
  const at::Tensor wide = x.to(at::promote_types(x.scalar_type(), at::kFloat));
  const at::Tensor normed = wide * at::rsqrt(wide.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return weight * normed.to(x.scalar_type());
}

Gpt2MlpImpl::Gpt2MlpImpl(const ModelConfig& config) {
  fc = register_module("fc", torch::nn::Linear(config.d_model, config.ffn_hidden));
  proj = register_module("proj", torch::nn::Linear(config.ffn_hidden, config.d_model));
}

at::Tensor Gpt2MlpImpl::forward(const at::Tensor& x) {
  return proj->forward(at::gelu(fc->forward(x), /*approximate=*/"tanh"));
}

LlamaMlpImpl::LlamaMlpImpl(const ModelConfig& config) {
  auto linear = [](int64_t in, int64_t out) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
  };
  gate = register_module("gate", linear(config.d_model, config.ffn_hidden));
  up = register_module("up", linear(config.d_model, config.ffn_hidden));
  down = register_module("down", linear(config.ffn_hidden, config.d_model));
}

at::Tensor LlamaMlpImpl::forward(const at::Tensor& x) {
  return down->forward(at::silu(gate->forward(x)) * up->forward(x));
}

namespace {

at::Tensor residual_dropout(const at::Tensor& x, double p, bool training) {
  return training && p > 0.0 ? at::dropout(x, p, /*train=*/true) : x;
}

}  // namespace

Gpt2BlockImpl::Gpt2BlockImpl(const ModelConfig& config) : dropout_(config.dropout) {
  const auto norm = torch::nn::LayerNormOptions({config.d_model}).eps(config.norm_eps);
  ln1 = register_module("ln1", torch::nn::LayerNorm(norm));
  attn = register_module("attn", Gpt2Attention(config));
  ln2 = register_module("ln2", torch::nn::LayerNorm(norm));
  mlp = register_module("mlp", Gpt2Mlp(config));
}

at::Tensor Gpt2BlockImpl::forward(const at::Tensor& x, const BlockContext& ctx) {
  const at::Tensor h =
      x + residual_dropout(attn->forward(ln1->forward(x), ctx), dropout_, is_training());
  return h + residual_dropout(mlp->forward(ln2->forward(h)), dropout_, is_training());
}

LlamaBlockImpl::LlamaBlockImpl(const ModelConfig& config) : dropout_(config.dropout) {
  attn_norm = register_module("attn_norm", RMSNorm(config.d_model, config.norm_eps));
  attn = register_module("attn", LlamaAttention(config));
  ffn_norm = register_module("ffn_norm", RMSNorm(config.d_model, config.norm_eps));
  mlp = register_module("mlp", LlamaMlp(config));
}

at::Tensor LlamaBlockImpl::forward(const at::Tensor& x, const BlockContext& ctx) {
  const at::Tensor h =
      x + residual_dropout(attn->forward(attn_norm->forward(x), ctx), dropout_, is_training());
  return h + residual_dropout(mlp->forward(ffn_norm->forward(h)), dropout_, is_training());
}

std::shared_ptr<BlockImpl> make_block(const ModelConfig& config) {
  if (config.family == ModelFamily::kGpt2) return std::make_shared<Gpt2BlockImpl>(config);
  return std::make_shared<LlamaBlockImpl>(config);
}

}  // namespace shardtrain::detail
