// ModelConfig: the parameter inventory of the three families, computed without allocating, and the
// consistency checks every other component relies on.
#include <stdexcept>
#include <string>

#include "shardtrain/model.h"

namespace shardtrain {
namespace {

std::string describe(const ModelConfig& config) {
  return "model config '" + (config.name.empty() ? std::string("custom") : config.name) + "' (" +
         to_string(config.family) + ")";
}

[[noreturn]] void fail(const ModelConfig& config, const std::string& what) {
  throw std::invalid_argument(describe(config) + ": " + what);
}

void require_positive(const ModelConfig& config, const char* field, int64_t value) {
  if (value <= 0)
    fail(config, std::string(field) + " must be positive, got " + std::to_string(value));
}

void add(std::vector<ParameterShape>& shapes, std::string name, std::vector<int64_t> shape) {
  shapes.push_back(ParameterShape{std::move(name), std::move(shape)});
}

// A LayerNorm's weight and bias under `prefix`.
void add_layer_norm(std::vector<ParameterShape>& shapes, const std::string& prefix, int64_t d) {
  add(shapes, prefix + "weight", {d});
  add(shapes, prefix + "bias", {d});
}

// A linear layer with a bias under `prefix`: weight [out, in], bias [out].
void add_biased_linear(std::vector<ParameterShape>& shapes, const std::string& prefix, int64_t out,
                       int64_t in) {
  add(shapes, prefix + "weight", {out, in});
  add(shapes, prefix + "bias", {out});
}

// GPT-2's and BERT's MLP under `prefix`: fc, then proj, both with biases.
void add_gelu_mlp(std::vector<ParameterShape>& shapes, const std::string& prefix, int64_t d,
                  int64_t hidden) {
  add_biased_linear(shapes, prefix + "fc.", hidden, d);
  add_biased_linear(shapes, prefix + "proj.", d, hidden);
}

// A SwiGLU MLP's weights under `prefix`: gate, up, down.
void add_swiglu(std::vector<ParameterShape>& shapes, const std::string& prefix, int64_t d,
                int64_t hidden) {
  add(shapes, prefix + "gate.weight", {hidden, d});
  add(shapes, prefix + "up.weight", {hidden, d});
  add(shapes, prefix + "down.weight", {d, hidden});
}

// What only the Llama family's variants have (Qwen2's biases, Qwen3's head norms and head size,
// Llama 3.1's RoPE scaling, Mistral's window) is refused in the GPT-2 family, and checked here.
void validate_llama_variant(const ModelConfig& c) {
  const bool llama = c.family == ModelFamily::kLlama;
  if (!llama && (c.head_dim != 0 || c.attention_bias || c.qk_norm || c.rope_scaling.enabled() ||
                 c.sliding_window != 0)) {
    fail(c,
         "head_dim, attention_bias, qk_norm, rope_scaling and sliding_window belong to the "
         "llama family, not " +
             to_string(c.family));
  }
  if (c.head_dim < 0) fail(c, "head_dim must be positive, got " + std::to_string(c.head_dim));
  if (c.sliding_window < 0) {
    fail(c, "sliding_window must be positive, got " + std::to_string(c.sliding_window));
  }
  const std::string& type = c.hf_model_type;
  const bool moe_type = type == "mixtral" || type == "qwen3_moe";
  if (c.moe() && !type.empty() && !moe_type) {
    fail(c, "hf_model_type \"" + type +
                "\" has no experts: a mixture-of-experts model is \"mixtral\" or \"qwen3_moe\"");
  }
  if (!c.moe() && moe_type) {
    fail(c, "hf_model_type \"" + type + "\" needs n_experts > 0");
  }
  if (!type.empty() && type != to_string(c.family) &&
      !(llama && (type == "mistral" || type == "qwen2" || type == "qwen3" || moe_type))) {
    fail(c, "hf_model_type \"" + type + "\" is not one of " +
                (llama ? "llama, mistral, qwen2, qwen3, mixtral, qwen3_moe" : to_string(c.family)));
  }
  const RopeScaling& r = c.rope_scaling;
  if (r.enabled() && !(r.factor >= 1.0 && r.low_freq_factor > 0.0 &&
                       r.high_freq_factor > r.low_freq_factor && r.original_context_length > 0)) {
    fail(c,
         "rope_scaling needs factor >= 1, 0 < low_freq_factor < high_freq_factor and a "
         "positive original context length");
  }
}

// The router and experts of a mixture-of-experts model (Llama family only).
void validate_experts(const ModelConfig& c) {
  if (!c.moe()) {
    if (c.n_experts < 0) fail(c, "n_experts must be positive, got " + std::to_string(c.n_experts));
    if (c.experts_per_token != 0 || c.n_shared_experts != 0 || c.capacity_factor != 0.0) {
      fail(c,
           "experts_per_token, n_shared_experts and capacity_factor belong to a "
           "mixture-of-experts model: set n_experts");
    }
    return;
  }
  if (c.family != ModelFamily::kLlama) {
    fail(c, "n_experts: mixture-of-experts blocks belong to the llama family, not " +
                to_string(c.family));
  }
  if (c.experts_per_token < 1) {
    fail(c, "experts_per_token must be at least 1 with n_experts " + std::to_string(c.n_experts) +
                ", got " + std::to_string(c.experts_per_token));
  }
  if (c.experts_per_token > c.n_experts) {
    fail(c, "experts_per_token " + std::to_string(c.experts_per_token) + " exceeds n_experts " +
                std::to_string(c.n_experts) + ": a token cannot go to more experts than there are");
  }
  if (c.n_shared_experts < 0) {
    fail(c, "n_shared_experts must not be negative, got " + std::to_string(c.n_shared_experts));
  }
  if (!(c.capacity_factor >= 0.0)) {
    fail(c, "capacity_factor must be 0 (dropless) or positive, got " +
                std::to_string(c.capacity_factor));
  }
  if (c.n_shared_experts > 0 && !c.hf_model_type.empty()) {
    fail(c, "n_shared_experts: Hugging Face's " + c.hf_model_type +
                " has no shared experts (leave hf_model_type unset)");
  }
  if (!(c.router_aux_loss_coef >= 0.0)) {
    fail(c, "router_aux_loss_coef must not be negative, got " +
                std::to_string(c.router_aux_loss_coef));
  }
}

}  // namespace

std::string to_string(ModelFamily family) {
  switch (family) {
    case ModelFamily::kGpt2:
      return "gpt2";
    case ModelFamily::kLlama:
      return "llama";
    case ModelFamily::kBert:
      return "bert";
  }
  return "unknown";
}

std::string ModelConfig::model_type() const {
  if (!hf_model_type.empty()) return hf_model_type;
  return moe() ? "mixtral" : to_string(family);
}

int64_t ParameterShape::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

void ModelConfig::validate() const {
  if (family != ModelFamily::kGpt2 && family != ModelFamily::kLlama &&
      family != ModelFamily::kBert) {
    fail(*this, "family must be gpt2, llama or bert");
  }
  require_positive(*this, "vocab_size", vocab_size);
  require_positive(*this, "context_length", context_length);
  require_positive(*this, "d_model", d_model);
  require_positive(*this, "n_layers", n_layers);
  require_positive(*this, "n_heads", n_heads);
  require_positive(*this, "n_kv_heads", n_kv_heads);
  require_positive(*this, "ffn_hidden", ffn_hidden);
  if (head_dim == 0 && d_model % n_heads != 0) {
    fail(*this, "d_model " + std::to_string(d_model) + " is not divisible by n_heads " +
                    std::to_string(n_heads));
  }
  if (n_heads % n_kv_heads != 0) {
    fail(*this, "n_heads " + std::to_string(n_heads) + " is not divisible by n_kv_heads " +
                    std::to_string(n_kv_heads));
  }
  // The fused qkv projection of GPT-2, and BERT's attention, have one key/value head per query
  // head.
  if (family != ModelFamily::kLlama && n_kv_heads != n_heads) {
    fail(*this, "n_kv_heads " + std::to_string(n_kv_heads) + " must equal n_heads " +
                    std::to_string(n_heads) + " in the " + to_string(family) +
                    " family (no grouped-query attention)");
  }
  if (family == ModelFamily::kBert) {
    if (type_vocab_size < 1) {
      fail(*this, "type_vocab_size must be positive in the bert family, got " +
                      std::to_string(type_vocab_size));
    }
    // Hugging Face's BertForMaskedLM always ties its decoder to the word embeddings.
    if (!tie_embeddings) fail(*this, "the bert family's head is tied to the token embedding");
  } else if (type_vocab_size != 0) {
    fail(*this, "type_vocab_size belongs to the bert family, not " + to_string(family));
  }
  // rotate_half pairs the first and second half of each head: the head size must split evenly.
  if (family == ModelFamily::kLlama && head_size() % 2 != 0) {
    fail(*this, "head size " + std::to_string(head_size()) +
                    " must be even for rotary position embeddings");
  }
  if (!(norm_eps > 0.0)) fail(*this, "norm_eps must be positive, got " + std::to_string(norm_eps));
  if (family == ModelFamily::kLlama && !(rope_theta > 0.0)) {
    fail(*this, "rope_theta must be positive, got " + std::to_string(rope_theta));
  }
  if (!(dropout >= 0.0 && dropout < 1.0)) {
    fail(*this, "dropout must be in [0, 1), got " + std::to_string(dropout));
  }
  validate_llama_variant(*this);
  validate_experts(*this);
}

std::vector<ParameterShape> ModelConfig::parameter_shapes() const {
  validate();  // the shapes below divide by n_heads
  const int64_t d = d_model;
  const int64_t q_width = n_heads * head_size();
  const int64_t kv_width = n_kv_heads * head_size();
  std::vector<ParameterShape> shapes;
  const bool bert = family == ModelFamily::kBert;
  add(shapes, "tok_emb.weight", {vocab_size, d});
  if (family != ModelFamily::kLlama) add(shapes, "pos_emb.weight", {context_length, d});
  if (bert) {
    add(shapes, "type_emb.weight", {type_vocab_size, d});
    add_layer_norm(shapes, "emb_norm.", d);
  }
  for (int64_t i = 0; i < n_layers; ++i) {
    const std::string p = "blocks." + std::to_string(i) + ".";
    if (bert) {
      for (const char* layer : {"attn.q.", "attn.k.", "attn.v.", "attn.o."}) {
        add_biased_linear(shapes, p + layer, d, d);
      }
      add_layer_norm(shapes, p + "attn_norm.", d);
      add_gelu_mlp(shapes, p + "mlp.", d, ffn_hidden);
      add_layer_norm(shapes, p + "mlp_norm.", d);
    } else if (family == ModelFamily::kGpt2) {
      add_layer_norm(shapes, p + "ln1.", d);
      add_biased_linear(shapes, p + "attn.qkv.", 3 * d, d);
      add_biased_linear(shapes, p + "attn.proj.", d, d);
      add_layer_norm(shapes, p + "ln2.", d);
      add_gelu_mlp(shapes, p + "mlp.", d, ffn_hidden);
    } else {
      add(shapes, p + "attn_norm.weight", {d});
      // The attention's registration order: q, k, v (each with its bias), o, the head norms.
      add(shapes, p + "attn.q.weight", {q_width, d});
      if (attention_bias) add(shapes, p + "attn.q.bias", {q_width});
      add(shapes, p + "attn.k.weight", {kv_width, d});
      if (attention_bias) add(shapes, p + "attn.k.bias", {kv_width});
      add(shapes, p + "attn.v.weight", {kv_width, d});
      if (attention_bias) add(shapes, p + "attn.v.bias", {kv_width});
      add(shapes, p + "attn.o.weight", {d, q_width});
      if (qk_norm) {
        add(shapes, p + "attn.q_norm.weight", {head_size()});
        add(shapes, p + "attn.k_norm.weight", {head_size()});
      }
      add(shapes, p + "ffn_norm.weight", {d});
      if (!moe()) {
        add_swiglu(shapes, p + "mlp.", d, ffn_hidden);
        continue;
      }
      add(shapes, p + "moe.router.weight", {n_experts, d});
      for (int64_t e = 0; e < n_experts; ++e) {
        add_swiglu(shapes, p + "moe.experts." + std::to_string(e) + ".", d, ffn_hidden);
      }
      if (n_shared_experts > 0) {
        add_swiglu(shapes, p + "moe.shared.", d, n_shared_experts * ffn_hidden);
      }
    }
  }
  if (bert) {
    // The head's own parameter (the projection's bias) comes before its layers'.
    add(shapes, "mlm.bias", {vocab_size});
    add_biased_linear(shapes, "mlm.dense.", d, d);
    add_layer_norm(shapes, "mlm.norm.", d);
  } else if (family == ModelFamily::kGpt2) {
    add_layer_norm(shapes, "ln_f.", d);
  } else {
    add(shapes, "norm.weight", {d});
  }
  if (!tie_embeddings) add(shapes, "lm_head.weight", {vocab_size, d});
  return shapes;
}

int64_t ModelConfig::num_parameters() const {
  int64_t total = 0;
  for (const auto& p : parameter_shapes()) total += p.numel();
  return total;
}

int64_t ModelConfig::active_parameters() const {
  const int64_t idle_experts = moe() ? n_experts - experts_per_token : 0;
  return num_parameters() - n_layers * idle_experts * 3 * d_model * ffn_hidden;
}

}  // namespace shardtrain
