// Memory math: what a model is made of, bytes per parameter of each model state, the ZeRO
// stages' partitioning, and the activations a transformer block keeps for backward.
#include <algorithm>
#include <stdexcept>

#include "shardtrain/plan.h"

namespace shardtrain {

PlanModel PlanModel::from_config(const ModelConfig& config) {
  PlanModel m;
  m.name = config.name.empty() ? "custom" : config.name;
  m.n_layers = config.n_layers;
  m.d_model = config.d_model;
  m.n_heads = config.n_heads;
  m.n_kv_heads = config.n_kv_heads;
  m.head_dim = config.head_dim;
  m.ffn_hidden = config.ffn_hidden;
  m.vocab_size = config.vocab_size;
  m.gated_mlp = config.family == ModelFamily::kLlama;
  m.data_parallel_only = config.bidirectional();
  m.dropout = config.dropout;
  for (const auto& p : config.parameter_shapes()) {
    m.num_parameters += p.numel();
    m.largest_layer = std::max(m.largest_layer, p.numel());
    if (p.name.rfind("blocks.0.", 0) == 0) m.block_parameters += p.numel();
  }
  m.root_parameters = m.num_parameters - m.n_layers * m.block_parameters;
  m.active_parameters = config.active_parameters();
  m.active_block_parameters =
      m.block_parameters - (m.num_parameters - m.active_parameters) / m.n_layers;
  if (config.moe()) {
    m.n_experts = config.n_experts;
    m.experts_per_token = config.experts_per_token;
    m.shared_experts = config.n_shared_experts;
  }
  const auto names = model_preset_names();
  if (std::find(names.begin(), names.end(), config.name) != names.end()) m.preset = config.name;
  return m;
}

int64_t PlanModel::block_lora_parameters(int64_t rank) const {
  const int64_t d = d_model, f = ffn_hidden;
  if (!gated_mlp) return rank * (8 * d + 2 * f);  // qkv d->3d, proj d->d, fc d->f, proj f->d
  const int64_t head = head_dim > 0 ? head_dim : d / std::max<int64_t>(1, n_heads);
  const int64_t q = n_heads * head, kv = n_kv_heads * head;
  // q d->q and o q->d, k and v d->kv, gate and up d->f, down f->d
  return rank * (2 * (d + q) + 2 * (d + kv) + 2 * (d + f) + (f + d));
}

PlanModel PlanModel::from_shapes(int64_t num_parameters, int64_t n_layers, int64_t d_model,
                                 int64_t n_heads, int64_t n_kv_heads, int64_t ffn_hidden,
                                 int64_t vocab_size, bool gated_mlp) {
  if (n_kv_heads == 0) n_kv_heads = n_heads;
  if (ffn_hidden == 0) ffn_hidden = 4 * d_model;
  auto positive = [](const char* what, int64_t v) {
    if (v <= 0) {
      throw std::invalid_argument(std::string("model shape: ") + what + " must be positive, got " +
                                  std::to_string(v));
    }
  };
  positive("parameters", num_parameters);
  positive("layers", n_layers);
  positive("d_model", d_model);
  positive("heads", n_heads);
  positive("kv_heads", n_kv_heads);
  positive("vocab", vocab_size);
  if (d_model % n_heads != 0 || n_heads % n_kv_heads != 0) {
    throw std::invalid_argument("model shape: d_model " + std::to_string(d_model) +
                                " must divide by heads " + std::to_string(n_heads) +
                                ", and heads by kv_heads " + std::to_string(n_kv_heads));
  }
  PlanModel m;
  m.name = "custom";
  m.num_parameters = num_parameters;
  m.n_layers = n_layers;
  m.d_model = d_model;
  m.n_heads = n_heads;
  m.n_kv_heads = n_kv_heads;
  m.ffn_hidden = ffn_hidden;
  m.vocab_size = vocab_size;
  m.gated_mlp = gated_mlp;
  const int64_t kv = n_kv_heads * (d_model / n_heads);
  // q, k, v, o; two or three MLP matrices; two norms (biases are left out: under 0.1%).
  m.block_parameters =
      d_model * (2 * d_model + 2 * kv) + (gated_mlp ? 3 : 2) * d_model * ffn_hidden + 2 * d_model;
  m.root_parameters = num_parameters - n_layers * m.block_parameters;
  // The blocks and the token embedding (tied or not, it is there once at least).
  const int64_t embedding = vocab_size * d_model;
  if (m.root_parameters < embedding) {
    throw std::invalid_argument("model shape: " + std::to_string(n_layers) + " layers of d_model " +
                                std::to_string(d_model) + " and ffn " + std::to_string(ffn_hidden) +
                                " hold " + std::to_string(n_layers * m.block_parameters) +
                                " parameters and the embedding of " + std::to_string(vocab_size) +
                                " tokens " + std::to_string(embedding) + ", more than the " +
                                std::to_string(num_parameters) + " given");
  }
  m.largest_layer = std::max({vocab_size * d_model, ffn_hidden * d_model, d_model * d_model});
  m.active_block_parameters = m.block_parameters;
  m.active_parameters = num_parameters;
  return m;
}

PrecisionBytes PrecisionBytes::of(const std::string& precision, const std::string& optimizer,
                                  bool fp32_grads) {
  PrecisionBytes b;
  if (precision == "bf16") {
    b.param = 2, b.grad = fp32_grads ? 4 : 2, b.master = 4;
  } else if (precision == "fp32" || precision == "bf16-autocast") {
    b.param = 4, b.grad = 4, b.master = 0;  // the fp32 parameters are the master weights
  } else {
    throw std::invalid_argument("precision '" + precision +
                                "' is not one of bf16, fp32, bf16-autocast");
  }
  if (fp32_grads && precision != "bf16") {
    throw std::invalid_argument("fp32 gradients are an option of precision bf16; with '" +
                                precision + "' the gradients already are fp32");
  }
  if (optimizer == "adamw" || optimizer == "adam") {
    b.optimizer_state = 8;  // exp_avg and exp_avg_sq in fp32
  } else if (optimizer == "sgd") {
    b.optimizer_state = 4;  // momentum in fp32
  } else {
    throw std::invalid_argument("optimizer '" + optimizer + "' is not one of adamw, adam, sgd");
  }
  return b;
}

MemoryBreakdown zero_model_states(const ZeroMemoryInputs& in, const PrecisionBytes& b,
                                  ZeroAccounting accounting) {
  if (in.n < 1) throw std::invalid_argument("zero_model_states: n must be >= 1");
  if (in.stage < 0 || in.stage > 3) {
    throw std::invalid_argument("zero_model_states: stage must be 0..3, got " +
                                std::to_string(in.stage));
  }
  const double full = in.parameters;
  const double part = in.sharded_parameters > 0 ? in.sharded_parameters : in.parameters / in.n;
  const double K = b.optimizer_total();
  MemoryBreakdown m;
  if (accounting == ZeroAccounting::kZeroPaper) {
    m.params = b.param * (in.stage >= 3 ? part : full);
    m.grads = b.grad * (in.stage >= 2 ? part : full);
    m.optimizer = K * (in.stage >= 1 ? part : full);
    if (in.offload_optimizer) m.host += m.optimizer, m.optimizer = 0;
    if (in.offload_params) m.host += m.params, m.params = 0;
    return m;
  }
  // The engine: with master weights the optimizer steps on an fp32 copy of its gradient
  // partition; without them the low-precision gradient is that partition.
  const double g_opt = b.master > 0 ? 4.0 : b.grad;
  // ... made from the low-precision gradient, unless that is fp32 already (Megatron's main_grad).
  const double extra_fp32 = b.master > 0 && b.grad < 4.0 ? 4.0 : 0.0;
  switch (in.stage) {
    case 0:  // DDP: fp32 gradient accumulation beside the reduced low-precision gradient
      m.params = b.param * full;
      m.grads = b.grad * full;
      m.optimizer = K * full;
      m.temporary = extra_fp32 * full;
      break;
    case 1:  // full gradients reduced in place; the fp32 copy of this rank's part at the step
      m.params = b.param * full;
      m.grads = b.grad * full;
      m.optimizer = K * part;
      m.temporary = in.offload_optimizer ? 0.0 : extra_fp32 * part;
      break;
    case 2:  // the fp32 partition persists; the full gradient is alive before its bucket reduces
      m.params = b.param * full;
      m.grads = g_opt * part;
      m.optimizer = K * part;
      // With offload, buckets are copied to the host as they are reduced.
      m.temporary = in.offload_optimizer ? 0.0 : b.grad * full;
      break;
    case 3:  // everything partitioned; the largest layer gathered with its gradient
      m.params = b.param * part;
      m.grads = g_opt * part;
      m.optimizer = K * part;
      m.temporary = (b.param + b.grad) * in.largest_layer;
      break;
  }
  if (in.offload_optimizer && in.stage >= 1) {
    // The optimizer runs on the host, on the host's copy of the gradient partition.
    if (in.stage >= 2) m.host += m.grads, m.grads = 0;
    if (in.stage == 1) m.host += g_opt * part;
    m.host += m.optimizer, m.optimizer = 0;
  }
  if (in.offload_params && in.stage == 3) m.host += m.params, m.params = 0;
  return m;
}

double block_activation_bytes(const PlanModel& model, int64_t seq_len, int64_t micro_batch,
                              bool recompute, bool fused_attention, int tp,
                              bool sequence_parallel) {
  const double s = static_cast<double>(seq_len), b = static_cast<double>(micro_batch);
  const double h = static_cast<double>(model.d_model), f = static_cast<double>(model.ffn_hidden);
  const double a = static_cast<double>(model.n_heads);
  const double kv = static_cast<double>(model.n_kv_heads) * h / a;
  const double t = tp;
  const double sbh = s * b * h;
  if (recompute) return 2.0 * sbh / (sequence_parallel ? t : 1.0);  // the block's input
  const bool dropout = model.dropout > 0;
  // Replicated across tensor-parallel ranks unless sequence parallel splits them: the two norm
  // inputs, the inputs of the qkv and first MLP matmuls, the two residual dropout masks.
  double replicated = 4 * sbh + 2 * sbh + 2 * sbh + (dropout ? 2 * sbh : 0.0);
  // Split by tensor parallelism: q and k (for the scores), v, the output projection's input,
  // the MLP's inner activations (GELU: fc output and GELU output; SwiGLU: gate, up, act(gate),
  // and the product).
  // A mixture of experts keeps that for each expert a token passes, and the rows gathered for
  // the experts, their weighted outputs and the router's fp32 probabilities.
  const bool moe = model.experts_per_token > 0;
  const double passes =
      moe ? static_cast<double>(model.experts_per_token + model.shared_experts) : 1.0;
  double split = 2 * sbh + 2 * s * b * kv + 2 * s * b * kv + 2 * sbh +
                 passes * (model.gated_mlp ? 8 : 4) * s * b * f;
  if (moe) {
    replicated += 4.0 * static_cast<double>(model.experts_per_token) * sbh +
                  4.0 * s * b * static_cast<double>(model.n_experts);
  }
  if (fused_attention) {
    split += 4.0 * a * s * b;  // fp32 log-sum-exp per row; no score matrix is kept
  } else {
    // softmax output (2 bytes), and with dropout its mask (1) and output (2): Korthikanti's 5as^2b
    split += (dropout ? 5.0 : 2.0) * a * s * s * b;
  }
  return (sequence_parallel ? replicated / t : replicated) + split / t;
}

double selective_block_activation_bytes(const PlanModel& model, int64_t seq_len,
                                        int64_t micro_batch, int tp, bool sequence_parallel) {
  const double s = static_cast<double>(seq_len), b = static_cast<double>(micro_batch);
  const double h = static_cast<double>(model.d_model), f = static_cast<double>(model.ffn_hidden);
  const double a = static_cast<double>(model.n_heads);
  const double kv = static_cast<double>(model.n_kv_heads) * h / a;
  const double t = tp;
  const double input = 2 * s * b * h / (sequence_parallel ? t : 1.0);
  const double attention = 2 * s * b * h / t + 4 * a * s * b / t;  // output and log-sum-exp
  // Llama: q (h), v (kv), gate (f), down (h); GPT-2: qkv (h + 2 kv), fc (f).
  const double matmuls =
      model.gated_mlp ? 2 * s * b * (h + kv + f + h) / t : 2 * s * b * (h + 2 * kv + f) / t;
  return input + attention + matmuls;
}

double selective_recomputed_parameters(const PlanModel& model) {
  const double h = static_cast<double>(model.d_model), f = static_cast<double>(model.ffn_hidden);
  const double kv = static_cast<double>(model.n_kv_heads) * h / static_cast<double>(model.n_heads);
  return model.gated_mlp ? h * kv + h * h + h * f : h * h + f * h;
}

}  // namespace shardtrain
