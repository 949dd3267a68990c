// Import of Hugging Face config.json files. Anything the model here cannot reproduce exactly
// (another activation, biases in Llama attention, RoPE scaling) is refused rather than ignored, so
// an imported configuration never silently describes a different network.
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

ModelConfig read_llama(const JsonReader& in) {
  ModelConfig c;
  c.family = ModelFamily::kLlama;
  c.vocab_size = in.integer("vocab_size");
  c.context_length = in.integer("max_position_embeddings");
  c.d_model = in.integer("hidden_size");
  c.n_layers = in.integer("num_hidden_layers");
  c.n_heads = in.integer("num_attention_heads");
  c.n_kv_heads = in.integer_or("num_key_value_heads", c.n_heads);
  c.ffn_hidden = in.integer("intermediate_size");
  c.norm_eps = in.number_or("rms_norm_eps", 1e-6);
  c.rope_theta = in.number_or("rope_theta", 10000.0);
  c.dropout = in.number_or("attention_dropout", 0.0);
  c.tie_embeddings = in.boolean_or("tie_word_embeddings", false);
  in.refuse_unless(in.string_or("hidden_act", "silu") == "silu", "hidden_act");
  in.refuse_unless(!in.boolean_or("attention_bias", false), "attention_bias");
  in.refuse_unless(!in.boolean_or("mlp_bias", false), "mlp_bias");
  // Llama 3.1's "llama3" frequency scaling changes every rotary angle; not implemented.
  in.refuse_unless(!in.has("rope_scaling"), "rope_scaling");
  if (in.has("head_dim") && c.n_heads > 0) {
    in.refuse_unless(in.integer("head_dim") == c.d_model / c.n_heads, "head_dim");
  }
  return c;
}

}  // namespace

ModelConfig model_config_from_hf_json(const std::string& path) {
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
  } else if (type == "llama") {
    config = read_llama(in);
  } else {
    in.fail("unsupported model_type \"" + type + "\" (supported: gpt2, llama)");
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
