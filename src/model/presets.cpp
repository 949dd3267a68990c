// Named model configurations. The large presets exist for the planner (parameter_shapes() needs no
// allocation); their sizes follow the published GPT-2 and Llama 3 configurations.
#include <functional>
#include <stdexcept>
#include <utility>

#include "shardtrain/model.h"

namespace shardtrain {
namespace {

ModelConfig gpt2(std::string name, int64_t d_model, int64_t n_layers, int64_t n_heads) {
  ModelConfig c;
  c.family = ModelFamily::kGpt2;
  c.name = std::move(name);
  c.vocab_size = 50257;
  c.context_length = 1024;
  c.d_model = d_model;
  c.n_layers = n_layers;
  c.n_heads = n_heads;
  c.n_kv_heads = n_heads;
  c.ffn_hidden = 4 * d_model;
  c.norm_eps = 1e-5;
  c.dropout = 0.0;
  c.tie_embeddings = true;
  return c;
}

ModelConfig llama3(std::string name, int64_t d_model, int64_t n_layers, int64_t n_heads,
                   int64_t ffn_hidden) {
  ModelConfig c;
  c.family = ModelFamily::kLlama;
  c.name = std::move(name);
  c.vocab_size = 128256;
  c.context_length = 8192;
  c.d_model = d_model;
  c.n_layers = n_layers;
  c.n_heads = n_heads;
  c.n_kv_heads = 8;
  c.ffn_hidden = ffn_hidden;
  c.norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  c.dropout = 0.0;
  c.tie_embeddings = false;
  return c;
}

ModelConfig tiny() {
  ModelConfig c = gpt2("tiny", 64, 2, 4);
  c.vocab_size = 257;  // bytes plus one special token
  c.context_length = 64;
  c.ffn_hidden = 256;
  return c;
}

ModelConfig tiny_llama() {
  ModelConfig c = llama3("tiny-llama", 64, 2, 4, 176);
  c.vocab_size = 257;
  c.context_length = 64;
  c.n_kv_heads = 2;  // keeps grouped-query attention under test
  c.rope_theta = 10000.0;
  return c;
}

const std::vector<std::pair<std::string, std::function<ModelConfig()>>>& presets() {
  static const std::vector<std::pair<std::string, std::function<ModelConfig()>>> table = {
      {"tiny", tiny},
      {"tiny-llama", tiny_llama},
      {"gpt2-124m", [] { return gpt2("gpt2-124m", 768, 12, 12); }},
      {"gpt2-350m", [] { return gpt2("gpt2-350m", 1024, 24, 16); }},
      {"llama3-8b", [] { return llama3("llama3-8b", 4096, 32, 32, 14336); }},
      {"llama3-70b", [] { return llama3("llama3-70b", 8192, 80, 64, 28672); }},
      {"llama3-405b", [] { return llama3("llama3-405b", 16384, 126, 128, 53248); }},
  };
  return table;
}

}  // namespace

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const auto& entry : presets()) names.push_back(entry.first);
  return names;
}

ModelConfig model_preset(const std::string& name) {
  for (const auto& entry : presets()) {
    if (entry.first == name) return entry.second();
  }
  std::string valid;
  for (const auto& entry : presets()) valid += (valid.empty() ? "" : ", ") + entry.first;
  throw std::invalid_argument("unknown model preset '" + name + "' (valid: " + valid + ")");
}

}  // namespace shardtrain
