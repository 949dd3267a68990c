// Building blocks of the decoders in model.h. Module and parameter names here are the public
// parameter names (blocks.{i}.attn.qkv.weight, ...), so registration order is part of the
// contract checked against ModelConfig::parameter_shapes().
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <memory>

#include "shardtrain/model.h"

namespace shardtrain::detail {

// What a block needs beyond its input, computed once per forward by the Transformer.
struct BlockContext {
  at::Tensor rope_cos;  // [T, head_dim] in the activations' dtype; Llama only
  at::Tensor rope_sin;
  bool use_sdpa = true;
};

// softmax(q k^T / sqrt(head_dim) with the future masked) v, through LibTorch's fused kernel or
// the reference computation. q, k, v: [B, heads, T, head_dim] with as many k/v heads as q heads.
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double dropout_p, bool use_sdpa);

// cos/sin tables of rotary embeddings for positions [0, length), in the "rotate_half" layout of
// Hugging Face Llama: column j and j + head_dim/2 share the frequency theta^(-2j/head_dim).
// Computed in double on the CPU, returned as [length, head_dim] with `options`.
std::pair<at::Tensor, at::Tensor> rope_tables(int64_t length, int64_t head_dim, double theta,
                                              const at::TensorOptions& options);
// x [..., T, head_dim] rotated by position: x * cos + rotate_half(x) * sin.
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

class Gpt2AttentionImpl : public torch::nn::Module {
 public:
  explicit Gpt2AttentionImpl(const ModelConfig& config);
  at::Tensor forward(const at::Tensor& x, const BlockContext& ctx);
  torch::nn::Linear qkv{nullptr}, proj{nullptr};

 private:
  int64_t n_heads_;
  double dropout_;
};
TORCH_MODULE(Gpt2Attention);

class LlamaAttentionImpl : public torch::nn::Module {
 public:
  explicit LlamaAttentionImpl(const ModelConfig& config);
  at::Tensor forward(const at::Tensor& x, const BlockContext& ctx);
  torch::nn::Linear q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr};

 private:
  int64_t n_heads_, n_kv_heads_;
  double dropout_;
};
TORCH_MODULE(LlamaAttention);

class Gpt2MlpImpl : public torch::nn::Module {
 public:
  explicit Gpt2MlpImpl(const ModelConfig& config);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Linear fc{nullptr}, proj{nullptr};
};
TORCH_MODULE(Gpt2Mlp);

class LlamaMlpImpl : public torch::nn::Module {
 public:
  explicit LlamaMlpImpl(const ModelConfig& config);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Linear gate{nullptr}, up{nullptr}, down{nullptr};
};
TORCH_MODULE(LlamaMlp);

// A pre-norm transformer block; the unit of activation checkpointing and of FSDP wrapping.
class BlockImpl : public torch::nn::Module {
 public:
  virtual at::Tensor forward(const at::Tensor& x, const BlockContext& ctx) = 0;
};

class Gpt2BlockImpl : public BlockImpl {
 public:
  explicit Gpt2BlockImpl(const ModelConfig& config);
  at::Tensor forward(const at::Tensor& x, const BlockContext& ctx) override;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  Gpt2Attention attn{nullptr};
  Gpt2Mlp mlp{nullptr};

 private:
  double dropout_;
};

class LlamaBlockImpl : public BlockImpl {
 public:
  explicit LlamaBlockImpl(const ModelConfig& config);
  at::Tensor forward(const at::Tensor& x, const BlockContext& ctx) override;
  RMSNorm attn_norm{nullptr}, ffn_norm{nullptr};
  LlamaAttention attn{nullptr};
  LlamaMlp mlp{nullptr};

 private:
  double dropout_;
};

std::shared_ptr<BlockImpl> make_block(const ModelConfig& config);

}  // namespace shardtrain::detail
