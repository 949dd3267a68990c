// Import of Hugging Face config.json files. Anything the model here cannot reproduce exactly
// (another activation, a bias on the attention's output, RoPE scaling other than Llama 3.1's, a
// sliding window Qwen switches on) is refused rather than ignored, so an imported configuration
// never silently describes a different network.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "shardtrain/model.h"

namespace shardtrain {
namespace {

class JsonReader {
 public:
  JsonReader(const nlohmann::json& json, std::string path) : json_(json), path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw std::invalid_argument("Hugging Face config " + path_ + ": " + what);
  }

  // Absent and null both mean "not given": HF writes null for defaults (n_inner, for one).
  bool has(const char* key) const { return json_.contains(key) && !json_.at(key).is_null(); }

  int64_t integer(const char* key) const {
    if (!has(key)) fail("missing key \"" + std::string(key) + "\"");
    const auto& v = json_.at(key);
    if (!v.is_number_integer())
      fail("key \"" + std::string(key) + "\" must be an integer, got " + v.dump());
    return v.get<int64_t>();
  }
  int64_t integer_or(const char* key, int64_t fallback) const {
    return has(key) ? integer(key) : fallback;
  }
  double number_or(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    const auto& v = json_.at(key);
    if (!v.is_number()) fail("key \"" + std::string(key) + "\" must be a number, got " + v.dump());
    return v.get<double>();
  }
  bool boolean_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const auto& v = json_.at(key);
    if (!v.is_boolean())
      fail("key \"" + std::string(key) + "\" must be true or false, got " + v.dump());
    return v.get<bool>();
  }
  std::string string_or(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    const auto& v = json_.at(key);
    if (!v.is_string()) fail("key \"" + std::string(key) + "\" must be a string, got " + v.dump());
    return v.get<std::string>();
  }
  const nlohmann::json& json() const { return json_; }
  void refuse_unless(bool supported, const char* key) const {
    if (!supported) fail("unsupported \"" + std::string(key) + "\": " + json_.at(key).dump());
  }

 private:
  const nlohmann::json& json_;
  std::string path_;
};

ModelConfig read_gpt2(const JsonReader& in) {
  ModelConfig c;
  c.family = ModelFamily::kGpt2;
  c.vocab_size = in.integer("vocab_size");
  c.context_length = in.has("n_positions") ? in.integer("n_positions") : in.integer("n_ctx");
  c.d_model = in.integer("n_embd");
  c.n_layers = in.integer("n_layer");
  c.n_heads = in.integer("n_head");
  c.n_kv_heads = c.n_heads;
  c.ffn_hidden = in.integer_or("n_inner", 4 * c.d_model);
  c.norm_eps = in.number_or("layer_norm_epsilon", 1e-5);
  // One rate serves attention, residual and embedding dropout here; GPT-2 sets all three alike.
  c.dropout = in.number_or("resid_pdrop", 0.0);
  c.tie_embeddings = in.boolean_or("tie_word_embeddings", true);
  // GPT-2's "gelu_new" is the tanh approximation implemented here.
  const std::string act = in.string_or("activation_function", "gelu_new");
  in.refuse_unless(act == "gelu_new" || act == "gelu_pytorch_tanh", "activation_function");
  in.refuse_unless(!in.boolean_or("scale_attn_by_inverse_layer_idx", false),
                   "scale_attn_by_inverse_layer_idx");
  return c;
}

// BertForMaskedLM's (and BertModel's) config.json: absolute positions, exact GELU. The two
// dropout rates must agree (one rate serves both here).
ModelConfig read_bert(const JsonReader& in) {
  ModelConfig c;
  c.family = ModelFamily::kBert;
  c.vocab_size = in.integer("vocab_size");
  c.context_length = in.integer_or("max_position_embeddings", 512);
  c.d_model = in.integer("hidden_size");
  c.n_layers = in.integer("num_hidden_layers");
  c.n_heads = in.integer("num_attention_heads");
  c.n_kv_heads = c.n_heads;
  c.ffn_hidden = in.integer("intermediate_size");
  c.type_vocab_size = in.integer_or("type_vocab_size", 2);
  c.norm_eps = in.number_or("layer_norm_eps", 1e-12);
  c.dropout = in.number_or("hidden_dropout_prob", 0.1);
  if (in.number_or("attention_probs_dropout_prob", c.dropout) != c.dropout) {
    in.fail(
        "hidden_dropout_prob and attention_probs_dropout_prob differ; one dropout rate "
        "serves both here");
  }
  c.tie_embeddings = true;
  in.refuse_unless(in.boolean_or("tie_word_embeddings", true), "tie_word_embeddings");
  in.refuse_unless(in.string_or("hidden_act", "gelu") == "gelu", "hidden_act");
  in.refuse_unless(in.string_or("position_embedding_type", "absolute") == "absolute",
                   "position_embedding_type");
  in.refuse_unless(!in.boolean_or("is_decoder", false), "is_decoder");
  return c;
}

// rope_scaling: null, or Llama 3.1's "llama3" type; the other kinds (linear, dynamic, yarn, ...)
// would change every angle differently and are refused.
RopeScaling read_rope_scaling(const JsonReader& in, const nlohmann::json& json) {
  RopeScaling r;
  if (!in.has("rope_scaling")) return r;
  const nlohmann::json& j = json.at("rope_scaling");
  const JsonReader scaling(j, "");
  const std::string kind =
      j.is_object() ? scaling.string_or("rope_type", scaling.string_or("type", "")) : "";
  in.refuse_unless(kind == "llama3", "rope_scaling");
  auto number = [&](const char* key) {
    if (!j.contains(key) || !j.at(key).is_number()) {
      in.fail("rope_scaling of type llama3 needs a number \"" + std::string(key) + "\"");
    }
    return j.at(key).get<double>();
  };
  r.factor = number("factor");
  r.low_freq_factor = number("low_freq_factor");
  r.high_freq_factor = number("high_freq_factor");
  r.original_context_length = static_cast<int64_t>(number("original_max_position_embeddings"));
  return r;
}

// Mixtral's experts: intermediate_size is each expert's width; the chosen experts' weights are
// always renormalized. Router jitter (noise on the router's input in training) is refused.
void read_mixtral_experts(const JsonReader& in, ModelConfig& c) {
  c.n_experts = in.integer("num_local_experts");
  c.experts_per_token = in.integer("num_experts_per_tok");
  c.norm_topk_prob = true;
  c.router_aux_loss_coef = in.number_or("router_aux_loss_coef", 0.001);
  in.refuse_unless(in.number_or("router_jitter_noise", 0.0) == 0.0, "router_jitter_noise");
}

// Qwen3-MoE's experts (width moe_intermediate_size) in every layer: dense layers between them
// (decoder_sparse_step other than 1, mlp_only_layers) are refused.
void read_qwen3_moe_experts(const JsonReader& in, ModelConfig& c) {
  c.n_experts = in.integer("num_experts");
  c.experts_per_token = in.integer("num_experts_per_tok");
  c.ffn_hidden = in.integer("moe_intermediate_size");
  c.norm_topk_prob = in.boolean_or("norm_topk_prob", false);
  c.router_aux_loss_coef = in.number_or("router_aux_loss_coef", 0.001);
  in.refuse_unless(in.integer_or("decoder_sparse_step", 1) == 1, "decoder_sparse_step");
  if (in.has("mlp_only_layers")) {
    in.refuse_unless(in.json().at("mlp_only_layers").empty(), "mlp_only_layers");
  }
}

// Llama and the models built on its decoder: Mistral (no biases, an optional sliding window),
// Qwen2/2.5 (biases on q, k and v) and Qwen3 (per-head q/k norms, head_dim of its own).
ModelConfig read_llama(const JsonReader& in, const nlohmann::json& json, const std::string& type) {
  ModelConfig c;
  c.family = ModelFamily::kLlama;
  c.hf_model_type = type;
  c.vocab_size = in.integer("vocab_size");
  c.context_length = in.integer("max_position_embeddings");
  c.d_model = in.integer("hidden_size");
  c.n_layers = in.integer("num_hidden_layers");
  c.n_heads = in.integer("num_attention_heads");
  c.n_kv_heads = in.integer_or("num_key_value_heads", c.n_heads);
  // Qwen3-MoE's experts have a width of their own (moe_intermediate_size) and no dense layer.
  c.ffn_hidden = type == "qwen3_moe" ? 0 : in.integer("intermediate_size");
  c.norm_eps = in.number_or("rms_norm_eps", 1e-6);
  c.rope_theta = in.number_or("rope_theta", 10000.0);
  c.dropout = in.number_or("attention_dropout", 0.0);
  c.tie_embeddings = in.boolean_or("tie_word_embeddings", false);
  in.refuse_unless(in.string_or("hidden_act", "silu") == "silu", "hidden_act");
  in.refuse_unless(!in.boolean_or("mlp_bias", false), "mlp_bias");
  // Llama's and Qwen3's attention_bias puts a bias on the output projection too, which the
  // model here does not have; Qwen2 always has biases on q, k and v only.
  if (type != "qwen2") in.refuse_unless(!in.boolean_or("attention_bias", false), "attention_bias");
  const bool qwen3 = type == "qwen3" || type == "qwen3_moe";
  c.attention_bias = type == "qwen2";
  c.qk_norm = qwen3;
  // transformers' Qwen3Config defaults head_dim to 128; the others to hidden_size / heads.
  c.head_dim = in.integer_or("head_dim", qwen3 ? 128 : 0);
  if (c.n_heads > 0 && c.head_dim * c.n_heads == c.d_model) c.head_dim = 0;
  c.rope_scaling = read_rope_scaling(in, json);
  if (type == "mistral" || type == "mixtral") {
    c.sliding_window = in.integer_or("sliding_window", 0);
  } else {
    // Qwen's window applies only from max_window_layers on, and only when switched on.
    in.refuse_unless(!in.boolean_or("use_sliding_window", false), "use_sliding_window");
  }
  if (type == "mixtral") read_mixtral_experts(in, c);
  if (type == "qwen3_moe") read_qwen3_moe_experts(in, c);
  return c;
}

}  // namespace

ModelConfig model_config_from_hf_json(const std::string& path) {
  if (std::filesystem::is_directory(path)) {
    throw std::invalid_argument("Hugging Face config " + path +
                                " is a directory: give its config.json");
  }
  std::ifstream file(path);
  if (!file) throw std::invalid_argument("Hugging Face config " + path + ": cannot open the file");
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(file);
  } catch (const nlohmann::json::exception& e) {  // also numbers that overflow a double
    throw std::invalid_argument("Hugging Face config " + path + ": not valid JSON (" + e.what() +
                                ")");
  }
  if (!json.is_object()) {
    throw std::invalid_argument("Hugging Face config " + path + ": expected a JSON object");
  }
  const JsonReader in(json, path);
  if (!in.has("model_type")) in.fail("missing key \"model_type\"");
  const std::string type = in.string_or("model_type", "");
  ModelConfig config;
  if (type == "gpt2") {
    config = read_gpt2(in);
  } else if (type == "bert") {
    config = read_bert(in);
  } else if (type == "llama" || type == "mistral" || type == "qwen2" || type == "qwen3" ||
             type == "mixtral" || type == "qwen3_moe") {
    config = read_llama(in, json, type);
  } else {
    in.fail("unsupported model_type \"" + type +
            "\" (supported: gpt2, bert, llama, mistral, qwen2, qwen3, mixtral, qwen3_moe)");
  }
  config.name = "custom";
  try {
    config.validate();
  } catch (const std::invalid_argument& e) {
    in.fail(e.what());
  }
  return config;
}

}  // namespace shardtrain
