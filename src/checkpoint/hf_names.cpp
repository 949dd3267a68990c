// Our parameter names against Hugging Face's, the model description kept in checkpoints, and
// the config.json of the three families.
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "checkpoint/model_description.h"
#include "checkpoint/safetensors_detail.h"
#include "shardtrain/hf.h"

namespace shardtrain {
namespace {

// Name inside a block ("attn.qkv.weight") -> HF name inside a layer, and whether it is a Conv1D.
std::pair<std::string, bool> gpt2_block_name(const std::string& rest) {
  static const std::map<std::string, std::pair<std::string, bool>> names = {
      {"ln1.weight", {"ln_1.weight", false}},
      {"ln1.bias", {"ln_1.bias", false}},
      {"attn.qkv.weight", {"attn.c_attn.weight", true}},
      {"attn.qkv.bias", {"attn.c_attn.bias", false}},
      {"attn.proj.weight", {"attn.c_proj.weight", true}},
      {"attn.proj.bias", {"attn.c_proj.bias", false}},
      {"ln2.weight", {"ln_2.weight", false}},
      {"ln2.bias", {"ln_2.bias", false}},
      {"mlp.fc.weight", {"mlp.c_fc.weight", true}},
      {"mlp.fc.bias", {"mlp.c_fc.bias", false}},
      {"mlp.proj.weight", {"mlp.c_proj.weight", true}},
      {"mlp.proj.bias", {"mlp.c_proj.bias", false}}};
  return names.at(rest);
}

// A mixture-of-experts block's name ("moe.router.weight", "moe.experts.3.up.weight") in
// Mixtral's layout (block_sparse_moe.gate, experts.N.w1/w3/w2) or Qwen3-MoE's (mlp.gate,
// experts.N.gate_proj/up_proj/down_proj).
std::string moe_block_name(const std::string& rest, const std::string& type) {
  const bool mixtral = type == "mixtral";
  const std::string block = mixtral ? "block_sparse_moe." : "mlp.";
  if (rest == "moe.router.weight") return block + "gate.weight";
  const std::string experts = "moe.experts.";
  const size_t dot = rest.find('.', experts.size());
  const std::string expert = rest.substr(experts.size(), dot - experts.size());
  const std::string layer = rest.substr(dot + 1);
  static const std::map<std::string, std::pair<std::string, std::string>> names = {
      {"gate.weight", {"w1.weight", "gate_proj.weight"}},
      {"up.weight", {"w3.weight", "up_proj.weight"}},
      {"down.weight", {"w2.weight", "down_proj.weight"}}};
  const auto& both = names.at(layer);
  return block + "experts." + expert + "." + (mixtral ? both.first : both.second);
}

// BertForMaskedLM's names inside bert.encoder.layer.N.
std::string bert_block_name(const std::string& rest) {
  static const std::map<std::string, std::string> names = {
      {"attn.q.weight", "attention.self.query.weight"},
      {"attn.q.bias", "attention.self.query.bias"},
      {"attn.k.weight", "attention.self.key.weight"},
      {"attn.k.bias", "attention.self.key.bias"},
      {"attn.v.weight", "attention.self.value.weight"},
      {"attn.v.bias", "attention.self.value.bias"},
      {"attn.o.weight", "attention.output.dense.weight"},
      {"attn.o.bias", "attention.output.dense.bias"},
      {"attn_norm.weight", "attention.output.LayerNorm.weight"},
      {"attn_norm.bias", "attention.output.LayerNorm.bias"},
      {"mlp.fc.weight", "intermediate.dense.weight"},
      {"mlp.fc.bias", "intermediate.dense.bias"},
      {"mlp.proj.weight", "output.dense.weight"},
      {"mlp.proj.bias", "output.dense.bias"},
      {"mlp_norm.weight", "output.LayerNorm.weight"},
      {"mlp_norm.bias", "output.LayerNorm.bias"}};
  return names.at(rest);
}

std::string llama_block_name(const std::string& rest) {
  static const std::map<std::string, std::string> names = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"attn.q.weight", "self_attn.q_proj.weight"},
      {"attn.k.weight", "self_attn.k_proj.weight"},
      {"attn.v.weight", "self_attn.v_proj.weight"},
      {"attn.o.weight", "self_attn.o_proj.weight"},
      {"attn.q.bias", "self_attn.q_proj.bias"},
      {"attn.k.bias", "self_attn.k_proj.bias"},
      {"attn.v.bias", "self_attn.v_proj.bias"},
      {"attn.q_norm.weight", "self_attn.q_norm.weight"},
      {"attn.k_norm.weight", "self_attn.k_norm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"mlp.gate.weight", "mlp.gate_proj.weight"},
      {"mlp.up.weight", "mlp.up_proj.weight"},
      {"mlp.down.weight", "mlp.down_proj.weight"}};
  return names.at(rest);
}

// config.json of the Llama family as transformers writes it for the model_type: Qwen2 states no
// attention_bias (its q, k, v always have biases), Qwen3 its head_dim, Mistral its window.
nlohmann::json llama_config_json(const ModelConfig& c) {
  const std::string type = c.model_type();
  static const std::map<std::string, std::string> architectures = {
      {"llama", "LlamaForCausalLM"},
      {"mistral", "MistralForCausalLM"},
      {"qwen2", "Qwen2ForCausalLM"},
      {"qwen3", "Qwen3ForCausalLM"},
      {"mixtral", "MixtralForCausalLM"},
      {"qwen3_moe", "Qwen3MoeForCausalLM"}};
  nlohmann::json j = {{"architectures", {architectures.at(type)}},
                      {"model_type", type},
                      {"vocab_size", c.vocab_size},
                      {"max_position_embeddings", c.context_length},
                      {"hidden_size", c.d_model},
                      {"num_hidden_layers", c.n_layers},
                      {"num_attention_heads", c.n_heads},
                      {"num_key_value_heads", c.n_kv_heads},
                      {"head_dim", c.head_size()},
                      {"intermediate_size", c.ffn_hidden},
                      {"hidden_act", "silu"},
                      {"rms_norm_eps", c.norm_eps},
                      {"rope_theta", c.rope_theta},
                      {"attention_dropout", c.dropout},
                      {"tie_word_embeddings", c.tie_embeddings}};
  if (type != "qwen2") j["attention_bias"] = false;
  if (type == "llama") j["mlp_bias"] = false;
  if (type == "qwen2" || type == "qwen3" || type == "qwen3_moe") j["use_sliding_window"] = false;
  if (type == "mixtral") {
    j["num_local_experts"] = c.n_experts;
    j["num_experts_per_tok"] = c.experts_per_token;
    j["router_aux_loss_coef"] = c.router_aux_loss_coef;
    j["router_jitter_noise"] = 0.0;
    j["output_router_logits"] = false;
  } else if (type == "qwen3_moe") {
    // No dense layer: intermediate_size (a dense MLP's width) is never used.
    j["moe_intermediate_size"] = c.ffn_hidden;
    j["num_experts"] = c.n_experts;
    j["num_experts_per_tok"] = c.experts_per_token;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["router_aux_loss_coef"] = c.router_aux_loss_coef;
    j["decoder_sparse_step"] = 1;
    j["mlp_only_layers"] = nlohmann::json::array();
    j["output_router_logits"] = false;
  }
  if (type == "mistral" || type == "mixtral") {
    j["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nullptr;
  }
  if (c.rope_scaling.enabled()) {
    j["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", c.rope_scaling.factor},
        {"low_freq_factor", c.rope_scaling.low_freq_factor},
        {"high_freq_factor", c.rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", c.rope_scaling.original_context_length}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  return j;
}

}  // namespace

std::vector<HfParameterName> hf_parameter_names(const ModelConfig& config) {
  const bool gpt2 = config.family == ModelFamily::kGpt2;
  const bool bert = config.family == ModelFamily::kBert;
  if (config.n_shared_experts > 0) {
    throw std::invalid_argument(
        "a model with shared experts (n_shared_experts " +
        std::to_string(config.n_shared_experts) +
        ") has no Hugging Face layout here: mixtral and qwen3_moe have none");
  }
  static const std::map<std::string, std::string> gpt2_top = {
      {"tok_emb.weight", "transformer.wte.weight"},
      {"pos_emb.weight", "transformer.wpe.weight"},
      {"ln_f.weight", "transformer.ln_f.weight"},
      {"ln_f.bias", "transformer.ln_f.bias"},
      {"lm_head.weight", "lm_head.weight"}};
  static const std::map<std::string, std::string> bert_top = {
      {"tok_emb.weight", "bert.embeddings.word_embeddings.weight"},
      {"pos_emb.weight", "bert.embeddings.position_embeddings.weight"},
      {"type_emb.weight", "bert.embeddings.token_type_embeddings.weight"},
      {"emb_norm.weight", "bert.embeddings.LayerNorm.weight"},
      {"emb_norm.bias", "bert.embeddings.LayerNorm.bias"},
      {"mlm.bias", "cls.predictions.bias"},
      {"mlm.dense.weight", "cls.predictions.transform.dense.weight"},
      {"mlm.dense.bias", "cls.predictions.transform.dense.bias"},
      {"mlm.norm.weight", "cls.predictions.transform.LayerNorm.weight"},
      {"mlm.norm.bias", "cls.predictions.transform.LayerNorm.bias"}};
  static const std::map<std::string, std::string> llama_top = {
      {"tok_emb.weight", "model.embed_tokens.weight"},
      {"norm.weight", "model.norm.weight"},
      {"lm_head.weight", "lm_head.weight"}};
  std::vector<HfParameterName> out;
  for (const auto& p : config.parameter_shapes()) {
    HfParameterName entry{p.name, "", false};
    if (p.name.rfind("blocks.", 0) == 0) {
      const size_t dot = p.name.find('.', 7);
      const std::string layer = p.name.substr(7, dot - 7);
      const std::string rest = p.name.substr(dot + 1);
      if (bert) {
        entry.hf_name = "bert.encoder.layer." + layer + "." + bert_block_name(rest);
      } else if (gpt2) {
        const auto [name, conv] = gpt2_block_name(rest);
        entry.hf_name = "transformer.h." + layer + "." + name;
        entry.transposed = conv;
      } else {
        entry.hf_name = "model.layers." + layer + "." +
                        (rest.rfind("moe.", 0) == 0 ? moe_block_name(rest, config.model_type())
                                                    : llama_block_name(rest));
      }
    } else {
      entry.hf_name = (bert ? bert_top : gpt2 ? gpt2_top : llama_top).at(p.name);
    }
    out.push_back(entry);
  }
  return out;
}

std::string hf_config_json(const ModelConfig& c, at::ScalarType dtype) {
  nlohmann::json j;
  if (c.family == ModelFamily::kGpt2) {
    j = {{"architectures", {"GPT2LMHeadModel"}},
         {"model_type", "gpt2"},
         {"vocab_size", c.vocab_size},
         {"n_positions", c.context_length},
         {"n_ctx", c.context_length},
         {"n_embd", c.d_model},
         {"n_layer", c.n_layers},
         {"n_head", c.n_heads},
         {"n_inner", c.ffn_hidden},
         {"activation_function", "gelu_new"},
         {"layer_norm_epsilon", c.norm_eps},
         {"resid_pdrop", c.dropout},
         {"embd_pdrop", c.dropout},
         {"attn_pdrop", c.dropout},
         {"tie_word_embeddings", c.tie_embeddings}};
  } else if (c.family == ModelFamily::kBert) {
    j = {{"architectures", {"BertForMaskedLM"}},
         {"model_type", "bert"},
         {"vocab_size", c.vocab_size},
         {"max_position_embeddings", c.context_length},
         {"hidden_size", c.d_model},
         {"num_hidden_layers", c.n_layers},
         {"num_attention_heads", c.n_heads},
         {"intermediate_size", c.ffn_hidden},
         {"type_vocab_size", c.type_vocab_size},
         {"hidden_act", "gelu"},
         {"layer_norm_eps", c.norm_eps},
         {"hidden_dropout_prob", c.dropout},
         {"attention_probs_dropout_prob", c.dropout},
         {"position_embedding_type", "absolute"},
         {"tie_word_embeddings", true}};
  } else {
    j = llama_config_json(c);
  }
  j["torch_dtype"] = dtype == at::kBFloat16 ? "bfloat16"
                     : dtype == at::kHalf   ? "float16"
                     : dtype == at::kDouble ? "float64"
                                            : "float32";
  return j.dump(2) + "\n";
}

namespace detail {

nlohmann::json describe_model(const ModelConfig& m) {
  return {{"family", to_string(m.family)},
          {"name", m.name},
          {"vocab_size", m.vocab_size},
          {"context_length", m.context_length},
          {"d_model", m.d_model},
          {"n_layers", m.n_layers},
          {"n_heads", m.n_heads},
          {"n_kv_heads", m.n_kv_heads},
          {"ffn_hidden", m.ffn_hidden},
          {"norm_eps", m.norm_eps},
          {"rope_theta", m.rope_theta},
          {"dropout", m.dropout},
          {"tie_embeddings", m.tie_embeddings},
          {"type_vocab_size", m.type_vocab_size},
          {"hf_model_type", m.hf_model_type},
          {"head_dim", m.head_dim},
          {"attention_bias", m.attention_bias},
          {"qk_norm", m.qk_norm},
          {"rope_scaling",
           {{"factor", m.rope_scaling.factor},
            {"low_freq_factor", m.rope_scaling.low_freq_factor},
            {"high_freq_factor", m.rope_scaling.high_freq_factor},
            {"original_context_length", m.rope_scaling.original_context_length}}},
          {"sliding_window", m.sliding_window},
          {"n_experts", m.n_experts},
          {"experts_per_token", m.experts_per_token},
          {"n_shared_experts", m.n_shared_experts},
          {"norm_topk_prob", m.norm_topk_prob},
          {"router_aux_loss_coef", m.router_aux_loss_coef},
          {"capacity_factor", m.capacity_factor}};
}

ModelConfig model_from_description(const nlohmann::json& j, const std::string& source) {
  ModelConfig m;
  try {
    const std::string family = j.at("family").get<std::string>();
    if (family != "gpt2" && family != "llama" && family != "bert") {
      throw std::invalid_argument(source + ": unknown model family '" + family + "'");
    }
    m.family = family == "gpt2"   ? ModelFamily::kGpt2
               : family == "bert" ? ModelFamily::kBert
                                  : ModelFamily::kLlama;
    m.name = j.value("name", "custom");
    m.vocab_size = detail::json_int64(j.at("vocab_size"), source + ": vocab_size");
    m.context_length = detail::json_int64(j.at("context_length"), source + ": context_length");
    m.d_model = detail::json_int64(j.at("d_model"), source + ": d_model");
    m.n_layers = detail::json_int64(j.at("n_layers"), source + ": n_layers");
    m.n_heads = detail::json_int64(j.at("n_heads"), source + ": n_heads");
    m.n_kv_heads = detail::json_int64(j.at("n_kv_heads"), source + ": n_kv_heads");
    m.ffn_hidden = detail::json_int64(j.at("ffn_hidden"), source + ": ffn_hidden");
    m.norm_eps = j.at("norm_eps").get<double>();
    m.rope_theta = j.at("rope_theta").get<double>();
    m.dropout = j.at("dropout").get<double>();
    m.tie_embeddings = j.at("tie_embeddings").get<bool>();
    // Written since the BERT family: a description without it has no token types.
    m.type_vocab_size = j.value("type_vocab_size", int64_t{0});
    // Written since the Llama-family variants: a description without them is plain Llama.
    m.hf_model_type = j.value("hf_model_type", std::string());
    m.head_dim = j.value("head_dim", int64_t{0});
    m.attention_bias = j.value("attention_bias", false);
    m.qk_norm = j.value("qk_norm", false);
    if (j.contains("rope_scaling")) {
      const nlohmann::json& r = j.at("rope_scaling");
      m.rope_scaling.factor = r.at("factor").get<double>();
      m.rope_scaling.low_freq_factor = r.at("low_freq_factor").get<double>();
      m.rope_scaling.high_freq_factor = r.at("high_freq_factor").get<double>();
      m.rope_scaling.original_context_length = r.at("original_context_length").get<int64_t>();
    }
    m.sliding_window = j.value("sliding_window", int64_t{0});
    // Written since mixture-of-experts models: a description without them is a dense model.
    m.n_experts = j.value("n_experts", int64_t{0});
    m.experts_per_token = j.value("experts_per_token", int64_t{0});
    m.n_shared_experts = j.value("n_shared_experts", int64_t{0});
    m.norm_topk_prob = j.value("norm_topk_prob", true);
    m.router_aux_loss_coef = j.value("router_aux_loss_coef", 0.0);
    m.capacity_factor = j.value("capacity_factor", 0.0);
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(source + ": the model description is incomplete (" + e.what() +
                                ")");
  }
  m.validate();
  return m;
}

}  // namespace detail
}  // namespace shardtrain
