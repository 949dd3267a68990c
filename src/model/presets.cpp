// Named model configurations. The large presets exist for the planner (parameter_shapes() needs no
// allocation); their sizes follow the published GPT-2, BERT, Llama 3/3.1/3.2, Qwen2.5, Qwen3 and
// Mistral configurations (config.json of each model).
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

// BERT (Devlin et al. 2019) as Hugging Face's bert-base-uncased and bert-large-uncased:
// WordPiece vocabulary of 30,522, 512 positions, two token types, exact GELU, LayerNorm eps 1e-12,
// dropout 0.1.
ModelConfig bert(std::string name, int64_t d_model, int64_t n_layers, int64_t n_heads) {
  ModelConfig c = gpt2(std::move(name), d_model, n_layers, n_heads);
  c.family = ModelFamily::kBert;
  c.vocab_size = 30522;
  c.context_length = 512;
  c.type_vocab_size = 2;
  c.norm_eps = 1e-12;
  c.dropout = 0.1;
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

// Llama 3.1's RoPE scaling as every Llama 3.1, 3.2 and 3.3 config.json states it, with its
// own factor (8 for 3.1 and 3.3, 32 for 3.2).
RopeScaling llama31_scaling(double factor) {
  RopeScaling r;
  r.factor = factor;
  r.low_freq_factor = 1.0;
  r.high_freq_factor = 4.0;
  r.original_context_length = 8192;
  return r;
}

ModelConfig llama31(std::string name, int64_t d_model, int64_t n_layers, int64_t n_heads,
                    int64_t ffn_hidden, double scaling_factor, bool tied) {
  ModelConfig c = llama3(std::move(name), d_model, n_layers, n_heads, ffn_hidden);
  c.hf_model_type = "llama";
  c.context_length = 131072;
  c.rope_scaling = llama31_scaling(scaling_factor);
  c.tie_embeddings = tied;
  return c;
}

// Qwen2.5 (biases on q, k, v) and Qwen3 (head norms, 128-wide heads) share a vocabulary of
// 151,936 rows and RoPE base 10^6; the small ones tie their embeddings.
ModelConfig qwen(std::string name, const std::string& type, int64_t d_model, int64_t n_layers,
                 int64_t n_heads, int64_t n_kv_heads, int64_t ffn_hidden) {
  ModelConfig c = llama3(std::move(name), d_model, n_layers, n_heads, ffn_hidden);
  c.hf_model_type = type;
  c.vocab_size = 151936;
  c.n_kv_heads = n_kv_heads;
  c.norm_eps = 1e-6;
  c.rope_theta = 1000000.0;
  c.tie_embeddings = true;
  if (type == "qwen2") {
    c.context_length = 32768;
    c.attention_bias = true;
  } else {
    c.context_length = 40960;
    c.head_dim = 128;
    c.qk_norm = true;
  }
  return c;
}

ModelConfig mistral_7b() {
  // Mistral-7B-v0.3: v0.1's shape with a 32,768-token vocabulary and no sliding window.
  ModelConfig c = llama3("mistral-7b", 4096, 32, 32, 14336);
  c.hf_model_type = "mistral";
  c.vocab_size = 32768;
  c.context_length = 32768;
  c.rope_theta = 1000000.0;
  return c;
}

// The tiny models of each variant, for tests: tiny-llama's shape with what the variant adds.
ModelConfig tiny_variant(const std::string& name) {
  ModelConfig c = tiny_llama();
  c.name = name;
  if (name == "tiny-llama3.2") {
    c.hf_model_type = "llama";
    c.tie_embeddings = true;
    // An original context of 32 puts the head's frequencies in all three bands of the scaling.
    c.rope_scaling = llama31_scaling(32.0);
    c.rope_scaling.original_context_length = 32;
  } else if (name == "tiny-qwen2") {
    c.hf_model_type = "qwen2";
    c.attention_bias = true;
    c.tie_embeddings = true;
    c.rope_theta = 1000000.0;
  } else if (name == "tiny-qwen3") {
    c.hf_model_type = "qwen3";
    c.head_dim = 32;  // 4 heads of 32 from d_model 64: wider than d_model / n_heads, as Qwen3
    c.qk_norm = true;
    c.tie_embeddings = true;
    c.norm_eps = 1e-6;
  } else {
    c.hf_model_type = "mistral";
    c.sliding_window = c.context_length;
  }
  return c;
}

// Mixtral 8x7B (v0.1): Mistral 7B's attention, 8 experts of width 14,336, two per token.
ModelConfig mixtral_8x7b() {
  ModelConfig c = llama3("mixtral-8x7b", 4096, 32, 32, 14336);
  c.hf_model_type = "mixtral";
  c.vocab_size = 32000;
  c.context_length = 32768;
  c.rope_theta = 1000000.0;
  c.n_experts = 8;
  c.experts_per_token = 2;
  c.router_aux_loss_coef = 0.02;
  return c;
}

// Qwen3-30B-A3B: 128 experts of width 768, eight per token, 3.3B parameters active.
ModelConfig qwen3_30b_a3b() {
  ModelConfig c = qwen("qwen3-30b-a3b", "qwen3", 2048, 48, 32, 4, 768);
  c.hf_model_type = "qwen3_moe";
  c.tie_embeddings = false;
  c.n_experts = 128;
  c.experts_per_token = 8;
  c.router_aux_loss_coef = 0.001;
  return c;
}

// The tiny mixture-of-experts models, for tests: 4 experts of width 96, two per token.
// tiny-moe: tiny-llama's attention, Mixtral's routing (weights renormalized). tiny-qwen3-moe:
// tiny-qwen3's attention (head norms), Qwen3-MoE's names, the weights left as the softmax gave
// them (norm_topk_prob false, transformers' default).
ModelConfig tiny_moe(const std::string& name) {
  const bool mixtral = name == "tiny-moe";
  ModelConfig c = mixtral ? tiny_llama() : tiny_variant("tiny-qwen3");
  c.name = name;
  c.hf_model_type = mixtral ? "mixtral" : "qwen3_moe";
  c.ffn_hidden = 96;
  c.n_experts = 4;
  c.experts_per_token = 2;
  c.norm_topk_prob = mixtral;
  c.router_aux_loss_coef = mixtral ? 0.02 : 0.001;
  return c;
}

const std::vector<std::pair<std::string, std::function<ModelConfig()>>>& presets() {
  static const std::vector<std::pair<std::string, std::function<ModelConfig()>>> table = {
      {"tiny", tiny},
      {"tiny-llama", tiny_llama},
      {"tiny-bert",
       [] {
         // d_model 96: its matrices split into the 48 or 64 quantization groups of
         // DeepSpeedExamples' BERT compression files.
         ModelConfig c = bert("tiny-bert", 96, 2, 4);
         c.vocab_size = 258;  // bytes, end-of-text and a mask token
         c.context_length = 64;
         c.ffn_hidden = 384;
         c.dropout = 0.0;
         return c;
       }},
      {"bert-base", [] { return bert("bert-base", 768, 12, 12); }},
      {"bert-large", [] { return bert("bert-large", 1024, 24, 16); }},
      {"gpt2-124m", [] { return gpt2("gpt2-124m", 768, 12, 12); }},
      {"gpt2-350m", [] { return gpt2("gpt2-350m", 1024, 24, 16); }},
      {"llama3-8b", [] { return llama3("llama3-8b", 4096, 32, 32, 14336); }},
      {"llama3-70b", [] { return llama3("llama3-70b", 8192, 80, 64, 28672); }},
      {"llama3-405b", [] { return llama3("llama3-405b", 16384, 126, 128, 53248); }},
      {"llama3.1-8b", [] { return llama31("llama3.1-8b", 4096, 32, 32, 14336, 8.0, false); }},
      {"llama3.2-1b", [] { return llama31("llama3.2-1b", 2048, 16, 32, 8192, 32.0, true); }},
      {"llama3.2-3b", [] { return llama31("llama3.2-3b", 3072, 28, 24, 8192, 32.0, true); }},
      {"qwen2.5-0.5b", [] { return qwen("qwen2.5-0.5b", "qwen2", 896, 24, 14, 2, 4864); }},
      {"qwen2.5-1.5b", [] { return qwen("qwen2.5-1.5b", "qwen2", 1536, 28, 12, 2, 8960); }},
      {"qwen3-0.6b", [] { return qwen("qwen3-0.6b", "qwen3", 1024, 28, 16, 8, 3072); }},
      {"qwen3-1.7b", [] { return qwen("qwen3-1.7b", "qwen3", 2048, 28, 16, 8, 6144); }},
      {"mistral-7b", mistral_7b},
      {"mixtral-8x7b", mixtral_8x7b},
      {"qwen3-30b-a3b", qwen3_30b_a3b},
      {"tiny-llama3.2", [] { return tiny_variant("tiny-llama3.2"); }},
      {"tiny-qwen2", [] { return tiny_variant("tiny-qwen2"); }},
      {"tiny-qwen3", [] { return tiny_variant("tiny-qwen3"); }},
      {"tiny-mistral", [] { return tiny_variant("tiny-mistral"); }},
      {"tiny-moe", [] { return tiny_moe("tiny-moe"); }},
      {"tiny-qwen3-moe", [] { return tiny_moe("tiny-qwen3-moe"); }},
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
