// Building blocks of the decoders in model.h. Module and parameter names here are the public
// parameter names (blocks.{i}.attn.qkv.weight, ...), so registration order is part of the
// contract checked against ModelConfig::parameter_shapes().
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <string>
#include <vector>

#include "model/blockwise_attention.h"
#include "model/context_split.h"
#include "model/expert_split.h"
#include "model/fake_quant.h"
#include "model/fp8.h"
#include "model/layer_split.h"
#include "shardtrain/model.h"

namespace shardtrain::detail {

// What the mixture-of-experts layers of one model share: the factor of the load-balancing
// loss's gradient, and what the layers saw in training forwards since the last
// TransformerImpl::take_moe_stats().
struct MoeState {
  // The training loss's gradient factor (the loss scale over the micro-batches of a step): the
  // load-balancing loss enters the gradient as router_aux_loss_coef x this x its value.
  double aux_weight = 1.0;
  at::Tensor tokens;     // [n_layers, n_experts] int64: tokens routed to each layer's experts
  double aux_sum = 0.0;  // the load-balancing losses computed, summed
  int64_t aux_count = 0;
  // Set by expert parallelism: the group the experts are split across, through which each
  // layer's rows reach the experts that other ranks hold. Null: this rank holds every expert.
  std::shared_ptr<ExpertSplit> split;
};

// What a block needs beyond its input, computed once per forward by the Transformer.
struct BlockContext {
  // [T, head_dim] in the activations' dtype; [B, 1, T, head_dim] for packed samples (each
  // token's own position). Llama only.
  at::Tensor rope_cos;
  at::Tensor rope_sin;
  AttentionKernel attention = AttentionKernel::kBlockwise;
  // A query reads only keys at its position or before (decoders), or every key (BERT).
  bool causal = true;
  // Packed samples, for the fused and reference kernels: [B, 1, T, T], true where query t may
  // attend to key s (s <= t when causal, same sample); undefined: plain causal attention, or
  // none without causality.
  at::Tensor allowed;
  // For the blockwise kernel: the same rule as positions and samples, on the activations' device.
  AttentionMask mask;
  // Sequences split by context parallelism (set only while the split is active): attention runs
  // through it, `mask` holding this rank's positions and all_segments every rank's segments.
  ContextSplit* cp = nullptr;
  at::Tensor all_segments;
  // The mixture-of-experts layers' shared state (MoeState); null for a dense model.
  MoeState* moe = nullptr;
  // What the block multiplies its residual branches by (progressive layer dropping: 1 / the
  // probability that it was kept).
  double residual_scale = 1.0;
  // The tokens' positions and samples (undefined: one sample, positions 0..T-1), and the number
  // of the training forward that random layer-token dropping draws for (-1: none).
  SequenceLayout layout;
  int64_t token_drop_forward = -1;
};

// Random layer-token dropping (Transformer::set_token_drop): the `keep` of `length` tokens that
// one block runs on for each of `batch` samples, [batch, keep] int64 in ascending order, drawn
// without replacement from the key, the forward's number and the block alone.
at::Tensor draw_kept_tokens(int64_t batch, int64_t length, int64_t keep, uint64_t key,
                            int64_t forward, int64_t block);

// softmax(q k^T / sqrt(head_dim) with the future masked) v through the kernel ctx names; without
// ctx.causal, nothing masked. q [B, heads, T, head_dim]; k, v [B, kv_heads, T, head_dim], heads a
// multiple of kv_heads. With ctx.allowed (ctx.mask's segments for the blockwise kernel) defined,
// what it forbids is masked instead. The blockwise kernel takes no dropout.
at::Tensor self_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          double dropout_p, const BlockContext& ctx);

// The rotary frequencies theta^(-2j/head_dim), j < head_dim/2, in double; with `scaling`
// enabled, Llama 3.1's rescaling of them (Hugging Face's _compute_llama3_parameters).
at::Tensor rope_inverse_frequencies(int64_t head_dim, double theta, const RopeScaling& scaling);
// cos/sin tables of rotary embeddings for positions [0, length), in the "rotate_half" layout of
// Hugging Face Llama: column j and j + head_dim/2 share frequency j. Computed in double on the
// CPU, returned as [length, head_dim] with `options`.
std::pair<at::Tensor, at::Tensor> rope_tables(int64_t length, int64_t head_dim, double theta,
                                              const at::TensorOptions& options,
                                              const RopeScaling& scaling = RopeScaling());
// x [..., T, head_dim] rotated by position: x * cos + rotate_half(x) * sin.
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// Every parameter of the model is created here, uninitialized (the Transformer initializes them
// all through its initializer). A deferred parameter is only described: the right shape and
// dtype, and no memory behind it until a strategy or TransformerImpl::materialize() gives it some.
at::Tensor new_parameter(at::IntArrayRef shape, bool deferred);

// x W^T + b. The model's own layers rather than torch::nn's, whose constructors allocate and
// initialize their weights, which a deferred construction must not do.
class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(int64_t in, int64_t out, bool bias, bool deferred);
  // x W^T + b, plus the LoRA update when the layer has an adapter (add_lora).
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight, bias;  // [out, in], [out] or undefined
  // The adapter's A [rank, in] and B [out, rank] layers (submodules "lora_A", "lora_B"), or null.
  std::shared_ptr<LinearImpl> lora_a, lora_b;
  double lora_scale = 0.0, lora_dropout = 0.0;
  // A frozen weight stored in NF4 (lora.base_dtype "nf4"): `weight` is then the packed bytes
  // (nf4.h) and this its shape [out, in]; empty otherwise.
  std::vector<int64_t> nf4_shape;
  // Set by parallelize_module: the group this layer is split across (null: not split), and
  // whether its input features (row-parallel) rather than its output features are split.
  std::shared_ptr<LayerSplit> tp;
  bool tp_rowwise = false;
  // Set by quantization-aware training (model/compression.h) on the layers it quantizes: their
  // weight and input quantizers, applied while `compression` says the technique has started.
  Quantizer weight_quant, input_quant;
  std::shared_ptr<const CompressionSwitches> compression;
  // Set by enable_fp8 (precision.fp8): the layer's scaling state; in training, forward then
  // computes through fp8_linear.
  std::shared_ptr<Fp8Scaling> fp8;

 private:
  at::Tensor tensor_parallel_forward(const at::Tensor& x);
  at::Tensor quantized_forward(const at::Tensor& x);
};
TORCH_MODULE(Linear);

// x W^T + b for a frozen W stored in another dtype than x (a LoRA base kept in bf16, or packed
// NF4 bytes of shape `nf4_shape`): W is cast (dequantized) to x's dtype for the product, and
// again in backward for x's gradient, so no copy of it in the activations' dtype outlives the
// call. W and b get no gradient.
at::Tensor frozen_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                         at::IntArrayRef nf4_shape = {});

// The values a layer computes with from its stored weight (bf16, fp32, or packed NF4 bytes of
// shape `nf4_shape`), as a new tensor in `dtype`.
at::Tensor stored_weight_values(const at::Tensor& weight, at::IntArrayRef nf4_shape,
                                at::ScalarType dtype);

// Stores the frozen weights of the model's linear layers (not its output head, not LoRA
// adapters) as `storage` says, "bf16" or "nf4" (packed bytes, nf4.h): materialized ones are
// converted, deferred ones described so (the model's initializer then fills them).
void store_frozen_linears(torch::nn::Module& model, const std::string& storage);

// A replicated weight that, under sequence parallelism, meets only this rank's part of the
// sequence (tp set and sequence parallelism on in this forward): the weight through Megatron's
// f, so that its gradient is summed across the group and every rank steps with the whole one.
// Otherwise the weight itself.
at::Tensor sequence_parallel_weight(const at::Tensor& weight,
                                    const std::shared_ptr<LayerSplit>& tp);
// The input of a column-parallel layer: the whole activation, gathered along the sequence under
// sequence parallelism, through Megatron's f otherwise (its gradient summed across the group).
at::Tensor column_parallel_input(const at::Tensor& x, const LayerSplit& tp);

class LayerNormImpl : public torch::nn::Module {
 public:
  LayerNormImpl(int64_t dim, double eps, bool deferred);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight, bias;
  // Set by parallelize_module (SequenceParallel): under sequence parallelism this rank sees
  // part of the sequence, and the weights' gradients are summed across the group.
  std::shared_ptr<LayerSplit> tp;

 private:
  double eps_;
};
TORCH_MODULE(LayerNorm);

class EmbeddingImpl : public torch::nn::Module {
 public:
  EmbeddingImpl(int64_t count, int64_t dim, bool deferred);
  // The rows of `ids`. Split over the vocabulary (tp set, RowwiseParallel), each rank looks up
  // the ids it holds and the rows are summed across the group: [B, T, dim] whole, or this
  // rank's part of the sequence under sequence parallelism.
  at::Tensor forward(const at::Tensor& ids);
  at::Tensor weight;  // [count, dim]
  std::shared_ptr<LayerSplit> tp;
  // Set by quantization-aware training on the token embedding a weight group names (DeepSpeed's
  // "word_embeddings"): the rows are looked up in the quantized weight once `compression` says
  // weight quantization has started.
  Quantizer weight_quant;
  std::shared_ptr<const CompressionSwitches> compression;
};
TORCH_MODULE(Embedding);

// x / rms(x) * weight over the last dim, normalized in float32 even for half-precision input and
// scaled in the input's dtype, as Hugging Face's Llama and Qwen3 do.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps, bool deferred);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;
  std::shared_ptr<LayerSplit> tp;  // as LayerNormImpl's

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

class Gpt2AttentionImpl : public torch::nn::Module {
 public:
  Gpt2AttentionImpl(const ModelConfig& config, bool deferred);
  at::Tensor forward(const at::Tensor& x, const BlockContext& ctx);
  Linear qkv{nullptr}, proj{nullptr};

 private:
  // Heads are counted from the projections' widths, so a layer split by heads across
  // tensor-parallel ranks computes with the heads it holds.
  int64_t head_dim_;
  double dropout_;
};
TORCH_MODULE(Gpt2Attention);

// Qwen3's q_norm and k_norm: RMSNorm of each head's [head_dim] vector. Not a sequence-parallel
// norm: every tensor-parallel rank holds the whole weight and normalizes only its own heads.
class HeadNormImpl : public torch::nn::Module {
 public:
  HeadNormImpl(int64_t head_dim, double eps, bool deferred);
  // x [..., head_dim]. Split by tensor parallelism (`tp` set), the weight goes through Megatron's
  // f so that its gradient, partial on each rank, is summed across the group.
  at::Tensor forward(const at::Tensor& x, const std::shared_ptr<LayerSplit>& tp);
  at::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(HeadNorm);

class LlamaAttentionImpl : public torch::nn::Module {
 public:
  LlamaAttentionImpl(const ModelConfig& config, bool deferred);
  at::Tensor forward(const at::Tensor& x, const BlockContext& ctx);
  Linear q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr};
  HeadNorm q_norm{nullptr}, k_norm{nullptr};  // null unless config.qk_norm

 private:
  int64_t head_dim_;  // as Gpt2AttentionImpl's
  double dropout_;
};
TORCH_MODULE(LlamaAttention);

// BERT's attention: q, k, v and the output projection o, each with a bias, every token reading
// every token of its sequence.
class BertAttentionImpl : public torch::nn::Module {
 public:
  BertAttentionImpl(const ModelConfig& config, bool deferred);
  at::Tensor forward(const at::Tensor& x, const BlockContext& ctx);
  Linear q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr};

 private:
  int64_t head_dim_;
  double dropout_;
};
TORCH_MODULE(BertAttention);

// fc, GELU, proj: GPT-2's tanh approximation of GELU, BERT's exact one.
class Gpt2MlpImpl : public torch::nn::Module {
 public:
  Gpt2MlpImpl(const ModelConfig& config, bool deferred);
  at::Tensor forward(const at::Tensor& x);
  Linear fc{nullptr}, proj{nullptr};

 private:
  const char* approximate_;  // at::gelu's "tanh" or "none"
};
TORCH_MODULE(Gpt2Mlp);

class LlamaMlpImpl : public torch::nn::Module {
 public:
  LlamaMlpImpl(const ModelConfig& config, bool deferred);
  LlamaMlpImpl(int64_t d_model, int64_t hidden, bool deferred);  // SwiGLU of width `hidden`
  at::Tensor forward(const at::Tensor& x);
  Linear gate{nullptr}, up{nullptr}, down{nullptr};
};
TORCH_MODULE(LlamaMlp);

// The experts' choice for N tokens: softmax over the router's logits [N, n_experts] in fp32
// (`probs`), the `k` most probable experts of each token (`experts` [N, k] int64) and their
// probabilities (`weights` [N, k] fp32), renormalized to sum 1 when `normalize`. Mixtral's and
// Qwen3-MoE's order: softmax, then top k.
struct Routing {
  at::Tensor probs, experts, weights;
};
Routing route(const at::Tensor& logits, int64_t k, bool normalize);

// The load-balancing loss of one layer, per sequence and averaged over the batch's rows:
// n_experts x sum_e f_e P_e, f_e the share of the row's token-to-expert assignments that went
// to expert e and P_e the mean router probability of e over the row (1 x k when balanced, as
// Hugging Face's load_balancing_loss_func). probs [B, T, E]; experts [B, T, k].
at::Tensor load_balancing_loss(const at::Tensor& probs, const at::Tensor& experts);

// A mixture-of-experts feed-forward block (ModelConfig::n_experts): the router, the experts
// (submodules "experts.{e}", SwiGLU MLPs of width ffn_hidden), the optional shared experts
// ("shared", one SwiGLU of n_shared_experts x ffn_hidden). Every expert computes in every
// training forward, on no rows when no token chose it, so each has a gradient (zero then).
// Under expert parallelism the block holds experts [first_expert, first_expert + count) of the
// model's (ModelParts), under their own names, and the other ranks' experts compute the rows
// routed to them (MoeState::split).
class MoeImpl : public torch::nn::Module {
 public:
  MoeImpl(const ModelConfig& config, int64_t layer, bool deferred, int64_t first_expert = 0,
          int64_t count = -1);
  // x [B, T, d_model] -> the same shape. In training, the load-balancing loss joins the
  // gradient (state->aux_weight) and the routing is counted in `state`.
  at::Tensor forward(const at::Tensor& x, MoeState* state);
  // Expert `e` of the model (a held one).
  LlamaMlp& expert(int64_t e);
  Linear router{nullptr};
  torch::nn::ModuleDict experts;  // keyed by the expert's index in the model
  LlamaMlp shared{nullptr};       // null without shared experts

 private:
  // The held experts on `rows` grouped by expert, counts[i] rows for the i-th held one.
  at::Tensor run_experts(const at::Tensor& rows, const std::vector<int64_t>& counts);

  int64_t layer_, top_k_, n_experts_, first_expert_;
  std::vector<LlamaMlp> held_;
  bool normalize_;
  double capacity_factor_, aux_coef_;
};
TORCH_MODULE(Moe);

// A transformer block; the unit of activation checkpointing and of FSDP wrapping.
class BlockImpl : public torch::nn::Module {
 public:
  virtual at::Tensor forward(const at::Tensor& x, const BlockContext& ctx) = 0;
};

class Gpt2BlockImpl : public BlockImpl {
 public:
  Gpt2BlockImpl(const ModelConfig& config, bool deferred);
  at::Tensor forward(const at::Tensor& x, const BlockContext& ctx) override;
  LayerNorm ln1{nullptr}, ln2{nullptr};
  Gpt2Attention attn{nullptr};
  Gpt2Mlp mlp{nullptr};

 private:
  double dropout_;
};

// BERT's post-norm block: LayerNorm after each residual sum (attn_norm after attention, mlp_norm
// after the MLP), the MLP's GELU exact.
class BertBlockImpl : public BlockImpl {
 public:
  BertBlockImpl(const ModelConfig& config, bool deferred);
  at::Tensor forward(const at::Tensor& x, const BlockContext& ctx) override;
  BertAttention attn{nullptr};
  LayerNorm attn_norm{nullptr}, mlp_norm{nullptr};
  Gpt2Mlp mlp{nullptr};

 private:
  double dropout_;
};

// BERT's masked-language-model head before its projection: dense, GELU, LayerNorm; `bias` is
// the projection's (onto the tied token embedding).
class MlmHeadImpl : public torch::nn::Module {
 public:
  MlmHeadImpl(const ModelConfig& config, bool deferred);
  at::Tensor forward(const at::Tensor& x);  // the transform; the projection is the model's
  at::Tensor bias;                          // [vocab]
  Linear dense{nullptr};
  LayerNorm norm{nullptr};
};
TORCH_MODULE(MlmHead);

class LlamaBlockImpl : public BlockImpl {
 public:
  // The experts [first_expert, first_expert + experts) of a mixture-of-experts block (-1: all).
  LlamaBlockImpl(const ModelConfig& config, int64_t layer, bool deferred, int64_t first_expert = 0,
                 int64_t experts = -1);
  at::Tensor forward(const at::Tensor& x, const BlockContext& ctx) override;
  RMSNorm attn_norm{nullptr}, ffn_norm{nullptr};
  LlamaAttention attn{nullptr};
  LlamaMlp mlp{nullptr};  // null in a mixture-of-experts model, which has `moe` instead
  Moe moe{nullptr};

 private:
  double dropout_;
};

// Block `layer` of the model, with the experts `parts` holds.
std::shared_ptr<BlockImpl> make_block(const ModelConfig& config, int64_t layer, bool deferred,
                                      const ModelParts& parts = ModelParts());

}  // namespace shardtrain::detail
