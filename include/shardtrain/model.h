// Reference models: the GPT-2 family (learned positions, LayerNorm, GELU MLP, tied
// embeddings) and the Llama family (RMSNorm, RoPE, SwiGLU, grouped-query attention), decoders
// trained to predict the next token; and the BERT family (bidirectional attention, LayerNorm
// after each residual sum, a masked-language-model head), an encoder trained to predict masked
// tokens.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace shardtrain {

enum class ModelFamily { kGpt2, kLlama, kBert };
std::string to_string(ModelFamily family);

// One parameter tensor of the model, described without allocating it.
struct ParameterShape {
  std::string name;  // as in the module tree, e.g. "blocks.0.attn.qkv.weight"
  std::vector<int64_t> shape;
  int64_t numel() const;
};

// Llama 3.1's "llama3" scaling of the rotary frequencies (config.json's rope_scaling): long
// wavelengths divided by `factor`, short ones kept, those between blended smoothly.
struct RopeScaling {
  double factor = 0.0;  // 0: no scaling
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_context_length = 8192;
  bool enabled() const { return factor > 0.0; }
};

struct ModelConfig {
  ModelFamily family = ModelFamily::kGpt2;
  std::string name;  // preset name, or "custom"
  int64_t vocab_size = 50257;
  int64_t context_length = 1024;  // longest sequence the model accepts
  int64_t d_model = 768;
  int64_t n_layers = 12;
  int64_t n_heads = 12;
  int64_t n_kv_heads = 12;    // < n_heads: grouped-query attention (Llama)
  int64_t ffn_hidden = 3072;  // MLP inner size (GPT-2: 4 d_model; Llama: SwiGLU width)
  double norm_eps = 1e-5;
  double rope_theta = 500000.0;  // Llama only
  double dropout = 0.0;          // attention-probability and residual dropout
  bool tie_embeddings = true;    // output projection shares the token embedding
  // BERT: the rows of the token-type (segment) embedding (Hugging Face's type_vocab_size, 2);
  // every token is of type 0 here. 0 in the other families.
  int64_t type_vocab_size = 0;

  // The models built on the Llama decoder differ in these (all off for Llama itself):
  // Hugging Face's model_type the model is exported as: "llama", "mistral", "qwen2" or "qwen3"
  // (empty: the family's own, "gpt2", "llama" or "bert").
  std::string hf_model_type;
  int64_t head_dim = 0;         // width of one attention head; 0: d_model / n_heads (Qwen3: 128)
  bool attention_bias = false;  // q, k and v projections have biases (Qwen2, Qwen2.5)
  bool qk_norm = false;         // each query and key head RMS-normalized before RoPE (Qwen3)
  RopeScaling rope_scaling;     // Llama 3.1, 3.2, 3.3
  // Mistral's sliding-window attention: a token attends to the last `sliding_window` positions;
  // 0 for none. Sequences longer than the window are refused (the window is not implemented).
  int64_t sliding_window = 0;

  // Mixture of experts (Llama family, Hugging Face's "mixtral" and "qwen3_moe"): with n_experts
  // > 0 each block's MLP becomes a linear router and n_experts SwiGLU experts of width
  // ffn_hidden; each token goes to the experts_per_token with the highest router probability
  // (softmax over all experts, then the top k), weighted by those probabilities, renormalized to
  // sum 1 when norm_topk_prob. n_shared_experts > 0 adds one SwiGLU of n_shared_experts x
  // ffn_hidden that every token passes through (DeepSeek's shared experts). docs/moe.md.
  int64_t n_experts = 0;
  int64_t experts_per_token = 0;
  int64_t n_shared_experts = 0;
  bool norm_topk_prob = true;
  // The load-balancing loss's weight in the training loss (config.json's router_aux_loss_coef).
  double router_aux_loss_coef = 0.0;
  // 0: dropless routing, every token reaches its experts. > 0: an expert takes at most
  // ceil(capacity_factor x tokens x experts_per_token / n_experts) of a forward's tokens, the
  // first ones in order; the others skip it.
  double capacity_factor = 0.0;

  bool moe() const { return n_experts > 0; }
  // A token attends to every token of its sequence (BERT), not only to earlier ones; the model
  // is then trained on masked tokens (DataLoaderOptions::masked_lm) instead of the next one.
  bool bidirectional() const { return family == ModelFamily::kBert; }
  int64_t head_size() const { return head_dim > 0 ? head_dim : d_model / n_heads; }
  // hf_model_type, or the family's name ("mixtral" for a mixture-of-experts model).
  std::string model_type() const;

  // Every parameter, in registration order, with its shape. No allocation: this is what the
  // planner uses for llama3-405b.
  std::vector<ParameterShape> parameter_shapes() const;
  int64_t num_parameters() const;  // sum of parameter_shapes(), tied weights counted once
  // The parameters one token computes with: num_parameters() less the experts it does not
  // reach (n_experts - experts_per_token of each block's). num_parameters() without experts.
  int64_t active_parameters() const;
  // Throws std::invalid_argument naming the field that is inconsistent (d_model not divisible
  // by n_heads, n_heads not divisible by n_kv_heads, non-positive sizes, ...).
  void validate() const;
};

// Presets: "tiny" (tests; GPT-2 family), "tiny-bert" (tests; BERT family), "tiny-llama",
// "tiny-llama3.2", "tiny-qwen2", "tiny-qwen3", "tiny-mistral", "tiny-moe", "tiny-qwen3-moe" (tests;
// each Llama-family variant), "gpt2-124m", "gpt2-350m", "bert-base", "bert-large", "llama3-8b",
// "llama3-70b", "llama3-405b", "llama3.1-8b", "llama3.2-1b", "llama3.2-3b", "qwen2.5-0.5b",
// "qwen2.5-1.5b", "qwen3-0.6b", "qwen3-1.7b", "mistral-7b", "mixtral-8x7b", "qwen3-30b-a3b"
// (docs/models.md). Throws std::invalid_argument listing the valid names for an unknown one.
ModelConfig model_preset(const std::string& name);
std::vector<std::string> model_preset_names();

// Reads a Hugging Face config.json of a GPT-2 ("model_type": "gpt2"), BERT ("bert"), Llama
// ("llama": Llama 2, 3, 3.1, 3.2, 3.3), Mistral ("mistral"), Qwen2/2.5 ("qwen2"), Qwen3 ("qwen3"),
// Mixtral
// ("mixtral") or Qwen3-MoE ("qwen3_moe") model. Throws std::invalid_argument naming the file and
// the missing or unsupported key.
ModelConfig model_config_from_hf_json(const std::string& path);

// Fills `out` (1-D, contiguous, any floating dtype) with elements [begin, begin + out.numel())
// of parameter `name` flattened, as the model's initialization defines them. Every element is a
// function of (seed, name, index) alone, so a rank can initialize any slice of any parameter by
// itself, and a sharded initialization equals the single-process one bit for bit, whatever the
// world size or strategy. Throws std::invalid_argument for a name the model does not have.
using ParameterInitializer =
    std::function<void(const std::string& name, int64_t begin, at::Tensor out)>;

// The parts of the model one rank builds: under pipeline parallelism (pipeline.h) the blocks of
// its stages, the embeddings when it holds the first stage, and the final norm and head when it
// holds the last (with tied embeddings, the token embedding too, which the head reads); under
// expert parallelism some of each block's experts. Blocks it does not hold are empty
// placeholders, so parameter names stay those of the whole model.
struct ModelParts {
  std::vector<std::pair<int64_t, int64_t>> blocks;  // [begin, end) of each stage held
  bool embedding = true;
  bool head = true;
  // The experts of each mixture-of-experts block held (expert parallelism): [first_expert,
  // first_expert + experts); experts = -1: all of them. They keep the whole model's names
  // ("blocks.{i}.moe.experts.{e}...").
  int64_t first_expert = 0;
  int64_t experts = -1;
  bool holds_block(int64_t index) const;
};

// How a Transformer gets its parameters.
struct ModelInit {
  // The initialization's seed. Unset: one number drawn from LibTorch's default generator, so
  // torch::manual_seed(s) before construction still fixes the model.
  ModelInit& seed(uint64_t value) {
    seed_ = value;
    has_seed_ = true;
    return *this;
  }
  // Describe the parameters without memory behind them (shapes and dtypes only). A strategy
  // (fully_shard, zero_shard) then allocates and initializes only what its rank holds, and
  // TransformerImpl::materialize() everything; until then forward must not be called.
  ModelInit& deferred(bool value = true) {
    deferred_ = value;
    return *this;
  }
  // Initial values from `init` (hf_initializer(): pretrained weights) instead of the random
  // initialization; it becomes the model's initializer().
  ModelInit& values(ParameterInitializer init) {
    values_ = std::move(init);
    return *this;
  }
  // Build only `parts` of the model (a pipeline stage, some experts); unset: the whole model.
  ModelInit& parts(ModelParts value) {
    parts_ = std::move(value);
    return *this;
  }
  uint64_t seed_ = 0;
  bool has_seed_ = false;
  bool deferred_ = false;
  ParameterInitializer values_;
  std::optional<ModelParts> parts_;
};

// True when `tensor` has memory behind it (or needs none); false for a deferred parameter, and
// for a sharded strategy's parameter while its unit is not gathered.
bool is_materialized(const at::Tensor& tensor);

// Calls made around a module's computation, so that a wrapper such as FSDP can act just in time
// (gather a unit's parameters before it computes, free them after) without replacing modules.
// Attached per module with set_module_hooks; shardtrain::call runs them, and the Transformer runs
// those of itself and of its hook_points(). `module` is the module they are attached to.
class ForwardHooks {
 public:
  virtual ~ForwardHooks() = default;
  // Before `module` computes: in forward, and again in backward when activation checkpointing
  // recomputes a block.
  virtual void pre_forward(torch::nn::Module& module) = 0;
  // After it computed `output`; returns the tensor the model continues with (the hook may
  // register a gradient hook on it). Also called after a recomputation in backward.
  virtual at::Tensor post_forward(torch::nn::Module& module, at::Tensor output) = 0;
  // The dtype shardtrain::call casts the floating-point tensor arguments to (a mixed-precision
  // policy's compute dtype), or none.
  virtual std::optional<at::ScalarType> input_dtype() const { return std::nullopt; }
};

namespace detail {
template <typename T>
decltype(auto) cast_input(T&& value, std::optional<at::ScalarType> dtype) {
  if constexpr (std::is_same_v<std::decay_t<T>, at::Tensor>) {
    if (dtype && value.defined() && value.is_floating_point() && value.scalar_type() != *dtype) {
      return value.to(*dtype);
    }
    return at::Tensor(value);
  } else {
    return std::forward<T>(value);
  }
}
}  // namespace detail

namespace detail {
// `output` plus the LoRA update of the torch::nn::Linear `module` for `input` when add_lora gave
// it an adapter (lora.h); `output` otherwise.
at::Tensor add_lora_output(const torch::nn::Module& module, const at::Tensor& input,
                           at::Tensor output);

// module->forward(args...), with the module's LoRA adapter applied to a one-tensor call.
template <typename ModulePtr, typename... Args>
auto forward_adapted(ModulePtr& module, const torch::nn::Module& target, Args&&... args)
    -> decltype(module->forward(std::forward<Args>(args)...)) {
  if constexpr (sizeof...(Args) == 1 && (std::is_same_v<std::decay_t<Args>, at::Tensor> && ...) &&
                std::is_same_v<decltype(module->forward(std::forward<Args>(args)...)),
                               at::Tensor>) {
    const at::Tensor input(args...);
    return add_lora_output(target, input, module->forward(input));
  } else {
    return module->forward(std::forward<Args>(args)...);
  }
}
}  // namespace detail

// Hooks attached to one module of any kind (fully_shard attaches its own), or null to detach
// them. Thread-safe; the entry is keyed by the module's address.
void set_module_hooks(const torch::nn::Module& module, std::shared_ptr<ForwardHooks> hooks);
std::shared_ptr<ForwardHooks> module_hooks(const torch::nn::Module& module);

// module->forward(args...) between the hooks attached to `module` (fully_shard: gather before,
// free after), or a plain forward call when none are. LibTorch C++ has no forward hooks, so a
// module calls its sharded children, and the training loop a sharded root, through this.
// `module` is a ModuleHolder (torch::nn::Linear, ...) or a std::shared_ptr to a module. A
// torch::nn::Linear that add_lora adapted adds its adapter's update to a one-tensor call. A
// forward that returns something other than one tensor gets no backward hook: its module's
// parameters then stay gathered until the end of backward. Floating-point tensor arguments are
// cast to the hooks' input_dtype() (FSDP's mixed-precision compute dtype).
template <typename ModulePtr, typename... Args>
auto call(ModulePtr& module, Args&&... args)
    -> decltype(module->forward(std::forward<Args>(args)...)) {
  torch::nn::Module& target = *module;
  const std::shared_ptr<ForwardHooks> hooks = module_hooks(target);
  if (!hooks) return detail::forward_adapted(module, target, std::forward<Args>(args)...);
  hooks->pre_forward(target);
  const std::optional<at::ScalarType> dtype = hooks->input_dtype();
  auto output = detail::forward_adapted(module, target,
                                        detail::cast_input(std::forward<Args>(args), dtype)...);
  if constexpr (std::is_same_v<std::decay_t<decltype(output)>, at::Tensor>) {
    return hooks->post_forward(target, std::move(output));
  } else {
    hooks->post_forward(target, at::Tensor());
    return output;
  }
}

namespace detail {
class LayerSplit;
class ContextSplit;
class ExpertSplit;
struct BlockContext;
struct MoeState;
struct TiedGradientSink;
}  // namespace detail

// What a mixture-of-experts model's layers routed in its training forwards since the last
// TransformerImpl::take_moe_stats(): the tokens each layer sent to each expert (zeros for the
// layers a pipeline stage does not hold), and the load-balancing losses computed (one per
// layer and forward), summed, with their number.
struct MoeStats {
  at::Tensor tokens_per_expert;  // [n_layers, n_experts] int64
  double aux_loss_sum = 0.0;
  int64_t aux_losses = 0;
};

// The target id of a token no loss is taken on (a prompt token, padding), as PyTorch's and
// Hugging Face's ignore_index.
constexpr int64_t kIgnoreIndex = -100;

// How attention is computed (TrainConfig's train.attention, Transformer::set_attention). All
// three give the same results within rounding.
enum class AttentionKernel {
  // Blocks of queries and keys with an online softmax (FlashAttention's algorithm): no
  // [T x T] tensor in forward or backward, so attention's memory grows linearly with the
  // sequence. No attention dropout.
  kBlockwise,
  // LibTorch's scaled_dot_product_attention: on LibTorch 2.x its flash or memory-efficient
  // kernels where the device has them; on 1.13 a computation that keeps the [T x T] weights.
  kFused,
  // softmax(QK^T / sqrt(d) + mask) V written out, the [T x T] scores and weights kept.
  kReference,
};

// Several samples packed into one row of a batch (instruction data): each token's position
// within its own sample, which restarts at 0 where a sample begins (learned positions and RoPE
// read it), and the sample it belongs to; a token attends only to earlier tokens of its own
// sample. Undefined tensors: each row is one sequence from position 0, attention causal.
struct SequenceLayout {
  at::Tensor positions;  // [B, T] int64
  at::Tensor segments;   // [B, T] int64, equal within a sample
  bool defined() const { return positions.defined(); }
};

// What forward_loss takes the cross-entropy against: `targets` [B, T] (kIgnoreIndex where no
// loss is taken), `divisor` (> 0: the sum over the kept targets / divisor; else their mean),
// and the tokens per chunk of the head's logits (0: chunks of about 32 MiB of fp32 logits).
struct LossTargets {
  at::Tensor targets;
  double divisor = 0.0;
  int64_t chunk = 0;
};

// The model. forward(tokens [B, T] int64) -> logits [B, T, vocab] in the parameters' dtype;
// split by tensor parallelism (parallelize_module), this rank's slice of the vocabulary
// [B, T, vocab / tp]. T must not exceed context_length (throws naming both).
class TransformerImpl : public torch::nn::Module {
 public:
  explicit TransformerImpl(ModelConfig config, ModelInit init = ModelInit());
  at::Tensor forward(const at::Tensor& tokens);
  // The same over rows of packed samples (`layout` [B, T] as tokens): positions restart per
  // sample and attention stays within each; an undefined layout is forward(tokens).
  at::Tensor forward(const at::Tensor& tokens, const SequenceLayout& layout);
  // forward's cross-entropy (a scalar) without ever holding the whole [B, T, vocab] logits: the
  // head's matmul, the softmax and their gradient run over chunks of tokens
  // (src/model/chunked_loss.h), tied embeddings and a vocabulary split by tensor parallelism
  // included; BERT's head runs on the positions that carry a target only. Equals the loss of
  // forward's logits, and its gradients theirs, to rounding.
  at::Tensor forward_loss(const at::Tensor& tokens, const SequenceLayout& layout,
                          const LossTargets& targets);
  // One pipeline stage's share of forward, blocks [begin, end): `input` is the tokens [B, T] when
  // `begin` is 0 (the embeddings run first), otherwise the hidden states the stage before
  // produced; when `end` is n_layers the final norm and head run and logits come out, otherwise
  // hidden states [B, T', d_model] (T' = T / tp under sequence parallelism). `length` is T. The
  // parts it runs must have been built (ModelInit::parts).
  // `layout`: as forward's, for the whole sequence of the micro-batch the stage computes.
  // With `with_head` false the last stage stops before the final norm and returns the hidden
  // states head_loss takes.
  at::Tensor forward_stage(const at::Tensor& input, int64_t begin, int64_t end, int64_t length,
                           const SequenceLayout& layout = SequenceLayout(), bool with_head = true);
  // The last stage's loss of the last block's output `x` (forward_stage(..., false)): the final
  // norm, then the head's matmul and the cross-entropy over chunks, as forward_loss.
  at::Tensor head_loss(const at::Tensor& x, const LossTargets& targets);
  // The parts this model holds (the whole model unless built with ModelInit::parts).
  const ModelParts& parts() const { return parts_; }

  // The initialization of every parameter (see ParameterInitializer): ModelInit's values, or
  // the random one, a copy that stays valid after the model is gone. GPT-2's scheme: N(0, 0.02)
  // for matrices, 0.02 / sqrt(2 n_layers) for the projections that write into the residual
  // stream (BERT's: 0.02 too), norm weights one, biases zero. LoRA adapters (add_lora) present
  // when it is called are initialized as lora.h says.
  ParameterInitializer initializer() const;
  uint64_t seed() const { return seed_; }
  // Whether every parameter has memory; materialize() allocates and initializes the ones that
  // have none (a deferred construction), leaving the others as they are.
  bool materialized() const;
  void materialize();

  // Per transformer block: the block's activations are not kept; backward recomputes them with
  // the same dropout randomness, so gradients are identical.
  void set_activation_checkpointing(bool enabled) { checkpointing_ = enabled; }
  bool activation_checkpointing() const { return checkpointing_; }
  // The kernel attention runs through: unless set, blockwise, or fused for a model with dropout.
  void set_attention(AttentionKernel kernel) { attention_ = kernel; }
  AttentionKernel attention() const { return attention_; }
  // Set by parallelize_module (tensor_parallel.h): what the model's layers ask of the group they
  // are split across; null when it is not split.
  const std::shared_ptr<detail::LayerSplit>& layer_split() const { return tp_; }
  void set_layer_split(std::shared_ptr<detail::LayerSplit> split) { tp_ = std::move(split); }
  // Set by context parallelism (apply_cp): the group its sequences are split across; null when
  // they are not. While the split is active a forward takes this rank's chunks of the sequences
  // (ContextScope) and attention reads the other ranks' keys by ring.
  const std::shared_ptr<detail::ContextSplit>& context_split() const { return cp_; }
  void set_context_split(std::shared_ptr<detail::ContextSplit> split) { cp_ = std::move(split); }
  // Set by FSDP for a tied embedding it reduces in two parts (src/model/tied_gradient.h): the
  // head's gradient of the token embedding (the chunked loss's) and the lookup's rows go to the
  // sink instead of the weight's .grad; null: into .grad, as autograd sums them.
  const std::shared_ptr<detail::TiedGradientSink>& tied_gradient_sink() const { return tied_sink_; }
  void set_tied_gradient_sink(std::shared_ptr<detail::TiedGradientSink> sink) {
    tied_sink_ = std::move(sink);
  }
  // Set by expert parallelism (apply_ep): the group a mixture-of-experts model's experts are
  // split across (this rank holding the experts parts() names), through which each layer sends
  // its tokens' rows to the experts' ranks; null when every expert is held here.
  std::shared_ptr<detail::ExpertSplit> expert_split() const;
  void set_expert_split(std::shared_ptr<detail::ExpertSplit> split);

  // A mixture-of-experts model (ModelConfig::n_experts): the load-balancing loss enters the
  // gradient as router_aux_loss_coef x `weight` x its value (the training loop sets the factor
  // it scales its own loss by: loss scale / micro-batches; 1 unless set). The loss a forward
  // returns never includes it. take_moe_stats: what the layers routed since the last call, and
  // the counts start again from zero; empty for a dense model.
  void set_aux_loss_weight(double weight);
  MoeStats take_moe_stats();
  // Progressive layer dropping (TrainConfig's train.layer_drop) for the forwards that follow
  // while the model is in training mode: `scales` holds one entry per block, 0 to skip the
  // block (its input passes on unchanged, its hooks do not run), else the factor its residual
  // branches are multiplied by (1 / the block's keep probability). Empty: every block runs as
  // it is.
  void set_layer_drop(std::vector<double> scales);
  // Random layer-token dropping (TrainConfig's train.random_ltd_*) for the forwards that follow
  // while the model is in training mode: each block whose entry in `layers` is true runs on
  // `tokens` of each sequence's tokens, drawn uniformly without replacement for each sample and
  // block and kept in their order (attention among them stays causal, at their own positions);
  // the other tokens pass that block unchanged. A sequence of no more than `tokens` runs whole.
  // The n-th forward after the call draws from `key` and n alone. Empty `layers`: none.
  struct TokenDrop {
    std::vector<bool> layers;
    int64_t tokens = 0;
    uint64_t key = 0;
  };
  void set_token_drop(TokenDrop drop);

  const ModelConfig& config() const { return config_; }
  // The transformer blocks, in order (the units FSDP wraps).
  torch::nn::ModuleList blocks() const { return blocks_; }
  // The submodules whose hooks (set_module_hooks) forward runs, in forward order: the blocks.
  // Each is called exactly once per forward (except a block set_layer_drop skips, whose hooks do
  // not run), and its parameters are used by no other part of the model. Forward runs the model's
  // own hooks around the whole of it.
  std::vector<std::shared_ptr<torch::nn::Module>> hook_points() const;

 private:
  ParameterInitializer base_initializer() const;  // the random initialization
  // The embeddings (tokens -> hidden states, and the BlockContext), the blocks [begin, end), and
  // the final norm and head.
  at::Tensor embed(const at::Tensor& tokens, int64_t length, const SequenceLayout& layout,
                   detail::BlockContext& ctx);
  at::Tensor run_blocks(at::Tensor x, int64_t begin, int64_t end, const detail::BlockContext& ctx);
  // forward and forward_loss: the whole model's blocks, then `end` of their output, between
  // the model's hooks.
  at::Tensor whole_forward(const at::Tensor& tokens, const SequenceLayout& layout,
                           const std::function<at::Tensor(const at::Tensor&)>& end);
  at::Tensor head(at::Tensor x);
  // The final norm (and, split, the head's column-parallel input), and the head's weight (the
  // token embedding's when tied).
  at::Tensor head_input(at::Tensor x);
  at::Tensor head_weight() const;
  // The tied-gradient sink when it applies (a tied, trained, unsplit embedding), else null.
  const detail::TiedGradientSink* tied_sink() const;
  void prepare_context(const at::Tensor& x, int64_t length, const SequenceLayout& layout,
                       detail::BlockContext& ctx);

  ModelConfig config_;
  uint64_t seed_ = 0;
  ParameterInitializer values_;  // from ModelInit; empty for the random initialization
  bool checkpointing_ = false;
  AttentionKernel attention_ = AttentionKernel::kBlockwise;
  std::shared_ptr<detail::LayerSplit> tp_;
  std::shared_ptr<detail::ContextSplit> cp_;
  std::shared_ptr<detail::MoeState> moe_;  // null for a dense model
  std::shared_ptr<detail::TiedGradientSink> tied_sink_;
  ModelParts parts_;
  torch::nn::ModuleList blocks_;
  std::vector<double> layer_drop_;  // set_layer_drop's scales; empty: none
  TokenDrop token_drop_;            // set_token_drop's; no layers: none
  int64_t token_drop_forwards_ = 0;  // the training forwards since set_token_drop
  // Embeddings, final norm and head are registered by the implementation (src/model/), held as
  // base pointers so that this header needs no module headers. pos_emb_ is null in the Llama
  // family, lm_head_ when the head is tied to the token embedding. BERT has a token-type
  // embedding and a norm after the embeddings, no final norm, and a masked-language-model head
  // (a dense layer, GELU and norm before the tied projection, which has a bias); the others
  // have none of these.
  std::shared_ptr<torch::nn::Module> tok_emb_, pos_emb_, final_norm_, lm_head_;
  std::shared_ptr<torch::nn::Module> type_emb_, emb_norm_, mlm_head_;
  // Rotary tables for the whole context (Llama), kept for the device and dtype last used so that
  // forward does not rebuild them and copy them to the device each call.
  at::Tensor rope_cos_, rope_sin_;
};
TORCH_MODULE(Transformer);

}  // namespace shardtrain
