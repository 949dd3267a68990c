// Import of Hugging Face config.json files of both families, and the errors that name the cause.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "shardtrain/model.h"

namespace shardtrain {
namespace hf_config_test {

class ModelHfConfig : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("shardtrain_hf_config_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string write(const std::string& text) {
    const std::string path = (dir_ / "config.json").string();
    std::ofstream(path) << text;
    return path;
  }

  // The message of the std::invalid_argument the import throws, or "" when it does not.
  std::string import_error(const std::string& text) {
    const std::string path = write(text);
    try {
      model_config_from_hf_json(path);
    } catch (const std::invalid_argument& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << "error does not name the file: " << msg;
      return msg;
    }
    return "";
  }

  std::filesystem::path dir_;
};

// openai-community/gpt2's config.json, abridged.
const char* kGpt2Json = R"({
  "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
  "attn_pdrop": 0.1, "embd_pdrop": 0.1, "resid_pdrop": 0.1, "layer_norm_epsilon": 1e-05,
  "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_inner": null,
  "n_layer": 12, "n_positions": 1024, "vocab_size": 50257
})";

// meta-llama/Meta-Llama-3-8B's config.json, abridged.
const char* kLlamaJson = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "hidden_act": "silu",
  "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 8192,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_scaling": null,
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "vocab_size": 128256
})";

TEST_F(ModelHfConfig, ImportsGpt2) {
  const ModelConfig c = model_config_from_hf_json(write(kGpt2Json));
  EXPECT_EQ(c.family, ModelFamily::kGpt2);
  EXPECT_EQ(c.vocab_size, 50257);
  EXPECT_EQ(c.context_length, 1024);
  EXPECT_EQ(c.d_model, 768);
  EXPECT_EQ(c.n_layers, 12);
  EXPECT_EQ(c.n_heads, 12);
  EXPECT_EQ(c.n_kv_heads, 12);
  EXPECT_EQ(c.ffn_hidden, 3072);  // n_inner null -> 4 n_embd
  EXPECT_DOUBLE_EQ(c.norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.dropout, 0.1);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.num_parameters(), model_preset("gpt2-124m").num_parameters());
}

TEST_F(ModelHfConfig, ImportsLlama) {
  const ModelConfig c = model_config_from_hf_json(write(kLlamaJson));
  EXPECT_EQ(c.family, ModelFamily::kLlama);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.context_length, 8192);
  EXPECT_EQ(c.d_model, 4096);
  EXPECT_EQ(c.n_layers, 32);
  EXPECT_EQ(c.n_heads, 32);
  EXPECT_EQ(c.n_kv_heads, 8);
  EXPECT_EQ(c.ffn_hidden, 14336);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_DOUBLE_EQ(c.norm_eps, 1e-5);
  EXPECT_FALSE(c.tie_embeddings);
  EXPECT_EQ(c.num_parameters(), 8030261248);
}

TEST_F(ModelHfConfig, AppliesDefaults) {
  // n_ctx stands in for n_positions; explicit n_inner; untied head.
  ModelConfig c = model_config_from_hf_json(write(
      R"({"model_type": "gpt2", "vocab_size": 257, "n_ctx": 64, "n_embd": 64, "n_layer": 2,
          "n_head": 4, "n_inner": 128, "tie_word_embeddings": false})"));
  EXPECT_EQ(c.context_length, 64);
  EXPECT_EQ(c.ffn_hidden, 128);
  EXPECT_FALSE(c.tie_embeddings);
  // No num_key_value_heads: multi-head attention; rope_theta defaults to 10000.
  c = model_config_from_hf_json(write(
      R"({"model_type": "llama", "vocab_size": 257, "max_position_embeddings": 64,
          "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "intermediate_size": 176, "rms_norm_eps": 1e-6})"));
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_FALSE(c.tie_embeddings);
}

TEST_F(ModelHfConfig, ErrorsNameFileAndKey) {
  EXPECT_THROW(model_config_from_hf_json((dir_ / "absent.json").string()), std::invalid_argument);
  EXPECT_NE(import_error("{ not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(import_error(R"({"vocab_size": 5})").find("model_type"), std::string::npos);
  EXPECT_NE(import_error(R"({"model_type": "t5"})").find("unsupported model_type \"t5\""),
            std::string::npos);
  EXPECT_NE(import_error(R"({"model_type": "bert"})").find("missing key \"vocab_size\""),
            std::string::npos);

  std::string gpt2 = kGpt2Json;
  gpt2.replace(gpt2.find("\"n_layer\": 12,"), 14, "");
  EXPECT_NE(import_error(gpt2).find("missing key \"n_layer\""), std::string::npos);

  std::string llama = kLlamaJson;
  llama.replace(llama.find("\"hidden_size\": 4096"), 19, "\"hidden_size\": \"big\"");
  EXPECT_NE(import_error(llama).find("\"hidden_size\" must be an integer"), std::string::npos);

  llama = kLlamaJson;
  llama.replace(llama.find("\"rope_scaling\": null"), 20,
                R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0})");
  EXPECT_NE(import_error(llama).find("rope_scaling"), std::string::npos);

  gpt2 = kGpt2Json;
  gpt2.replace(gpt2.find("gelu_new"), 8, "relu");
  EXPECT_NE(import_error(gpt2).find("activation_function"), std::string::npos);

  // Values that parse but make no model are reported through validate(), with the file name.
  llama = kLlamaJson;
  llama.replace(llama.find("\"num_key_value_heads\": 8"), 24, "\"num_key_value_heads\": 5");
  EXPECT_NE(import_error(llama).find("n_kv_heads 5"), std::string::npos);
}

// The config.json files of the model families people fine-tune, abridged (keys the import does
// not read left out): each imports as the preset of the same model.
TEST_F(ModelHfConfig, ImportsTheFamiliesAsTheirPresets) {
  struct Case {
    const char* preset;
    const char* json;
  };
  const Case cases[] = {
      {"llama3.2-1b", R"({
        "architectures": ["LlamaForCausalLM"], "attention_bias": false, "head_dim": 64,
        "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 8192,
        "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
        "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0,
        "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": true, "vocab_size": 128256})"},
      {"qwen2.5-0.5b", R"({
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "hidden_act": "silu",
        "hidden_size": 896, "intermediate_size": 4864, "max_position_embeddings": 32768,
        "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
        "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
        "use_sliding_window": false, "vocab_size": 151936})"},
      {"qwen3-0.6b", R"({
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "head_dim": 128,
        "hidden_act": "silu", "hidden_size": 1024, "intermediate_size": 3072,
        "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
        "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
        "sliding_window": null, "tie_word_embeddings": true, "use_sliding_window": false,
        "vocab_size": 151936})"},
      {"mistral-7b", R"({
        "architectures": ["MistralForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
        "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": null,
        "tie_word_embeddings": false, "vocab_size": 32768})"},
      {"mixtral-8x7b", R"({
        "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "hidden_act": "silu",
        "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 32768,
        "model_type": "mixtral", "num_attention_heads": 32, "num_experts_per_tok": 2,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
        "output_router_logits": false, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.02, "sliding_window": null, "tie_word_embeddings": false,
        "vocab_size": 32000})"},
      {"qwen3-30b-a3b", R"({
        "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false,
        "attention_dropout": 0.0, "decoder_sparse_step": 1, "head_dim": 128,
        "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 6144,
        "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
        "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": true,
        "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
        "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": false,
        "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.001, "sliding_window": null, "tie_word_embeddings": false,
        "use_sliding_window": false, "vocab_size": 151936})"},
  };
  for (const Case& c : cases) {
    const ModelConfig imported = model_config_from_hf_json(write(c.json));
    const ModelConfig preset = model_preset(c.preset);
    EXPECT_EQ(imported.model_type(), preset.model_type()) << c.preset;
    EXPECT_EQ(imported.head_size(), preset.head_size()) << c.preset;
    EXPECT_EQ(imported.attention_bias, preset.attention_bias) << c.preset;
    EXPECT_EQ(imported.qk_norm, preset.qk_norm) << c.preset;
    EXPECT_EQ(imported.tie_embeddings, preset.tie_embeddings) << c.preset;
    EXPECT_EQ(imported.context_length, preset.context_length) << c.preset;
    EXPECT_DOUBLE_EQ(imported.rope_theta, preset.rope_theta) << c.preset;
    EXPECT_DOUBLE_EQ(imported.rope_scaling.factor, preset.rope_scaling.factor) << c.preset;
    EXPECT_EQ(imported.rope_scaling.original_context_length,
              preset.rope_scaling.original_context_length)
        << c.preset;
    EXPECT_EQ(imported.sliding_window, 0) << c.preset;
    EXPECT_EQ(imported.num_parameters(), preset.num_parameters()) << c.preset;
    EXPECT_EQ(imported.n_experts, preset.n_experts) << c.preset;
    EXPECT_EQ(imported.experts_per_token, preset.experts_per_token) << c.preset;
    EXPECT_EQ(imported.norm_topk_prob, preset.norm_topk_prob) << c.preset;
    EXPECT_DOUBLE_EQ(imported.router_aux_loss_coef, preset.router_aux_loss_coef) << c.preset;
    EXPECT_EQ(imported.active_parameters(), preset.active_parameters()) << c.preset;
  }
}

TEST_F(ModelHfConfig, RefusesExpertLayoutsItCannotReproduce) {
  const std::string qwen3_moe = R"({"model_type": "qwen3_moe", "vocab_size": 257,
      "max_position_embeddings": 64, "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "intermediate_size": 176, "moe_intermediate_size": 32,
      "num_experts": 4)";
  EXPECT_EQ(model_config_from_hf_json(write(qwen3_moe + R"(, "num_experts_per_tok": 2})")).ffn_hidden,
            32);
  EXPECT_NE(import_error(qwen3_moe + R"(, "num_experts_per_tok": 5})").find("exceeds n_experts"),
            std::string::npos);
  EXPECT_NE(import_error(qwen3_moe + R"(, "num_experts_per_tok": 2, "decoder_sparse_step": 2})")
                .find("decoder_sparse_step"),
            std::string::npos);
  EXPECT_NE(import_error(qwen3_moe + R"(, "num_experts_per_tok": 2, "mlp_only_layers": [0]})")
                .find("mlp_only_layers"),
            std::string::npos);
  std::string mixtral = qwen3_moe;
  mixtral.replace(mixtral.find("qwen3_moe"), 9, "mixtral");
  mixtral.replace(mixtral.find("num_experts\""), 12, "num_local_experts\"");
  EXPECT_NE(import_error(mixtral + R"(, "num_experts_per_tok": 2, "router_jitter_noise": 0.1})")
                .find("router_jitter_noise"),
            std::string::npos);
  EXPECT_NE(import_error(mixtral + "}").find("num_experts_per_tok"), std::string::npos);
}

TEST_F(ModelHfConfig, RefusesWhatTheFamiliesCannotReproduce) {
  const std::string qwen3 = R"({"model_type": "qwen3", "vocab_size": 257,
      "max_position_embeddings": 64, "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "intermediate_size": 176)";
  // Qwen3's head_dim defaults to 128 as in transformers' Qwen3Config.
  EXPECT_EQ(model_config_from_hf_json(write(qwen3 + "}")).head_size(), 128);
  EXPECT_NE(import_error(qwen3 + R"(, "attention_bias": true})").find("attention_bias"),
            std::string::npos);
  EXPECT_NE(import_error(qwen3 + R"(, "use_sliding_window": true})").find("use_sliding_window"),
            std::string::npos);
  EXPECT_NE(import_error(qwen3 + R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})")
                .find("rope_scaling"),
            std::string::npos);
  // Mistral 7B v0.1's 4096-token window is kept: training refuses longer sequences.
  std::string mistral = qwen3;
  mistral.replace(mistral.find("qwen3"), 5, "mistral");
  const ModelConfig windowed =
      model_config_from_hf_json(write(mistral + R"(, "sliding_window": 32})"));
  EXPECT_EQ(windowed.sliding_window, 32);
  EXPECT_EQ(windowed.head_size(), 16);
}

}  // namespace hf_config_test
}  // namespace shardtrain
