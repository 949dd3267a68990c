// ModelConfig: parameter inventory against the real module, published sizes, and validation.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "shardtrain/model.h"

namespace shardtrain {
namespace config_test {

std::string validate_error(const ModelConfig& config) {
  try {
    config.validate();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

void expect_shapes_match_module(const ModelConfig& config) {
  Transformer model(config);
  const auto shapes = config.parameter_shapes();
  const auto params = model->named_parameters();
  ASSERT_EQ(shapes.size(), params.size()) << config.name;
  int64_t total = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    EXPECT_EQ(shapes[i].name, params[i].key()) << "parameter " << i << " of " << config.name;
    EXPECT_EQ(shapes[i].shape, params[i].value().sizes().vec()) << shapes[i].name;
    total += params[i].value().numel();
  }
  EXPECT_EQ(config.num_parameters(), total);
}

TEST(ModelConfig, ParameterShapesMatchNamedParameters) {
  expect_shapes_match_module(model_preset("tiny"));
  expect_shapes_match_module(model_preset("tiny-llama"));
  expect_shapes_match_module(model_preset("tiny-bert"));
  for (const char* variant : {"tiny-llama3.2", "tiny-qwen2", "tiny-qwen3", "tiny-mistral",
                              "tiny-moe", "tiny-qwen3-moe"}) {
    expect_shapes_match_module(model_preset(variant));
  }
  ModelConfig shared = model_preset("tiny-moe");  // with a shared expert and a capacity
  shared.hf_model_type.clear();
  shared.n_shared_experts = 2;
  shared.capacity_factor = 1.5;
  expect_shapes_match_module(shared);
  // The other head choice of each family: an untied GPT-2 head, a tied Llama one.
  ModelConfig untied = model_preset("tiny");
  untied.tie_embeddings = false;
  expect_shapes_match_module(untied);
  ModelConfig tied = model_preset("tiny-llama");
  tied.tie_embeddings = true;
  expect_shapes_match_module(tied);
}

TEST(ModelConfig, PresetParameterCountsArePublishedOnes) {
  EXPECT_EQ(model_preset("tiny").num_parameters(), 120640);  // as in docs/models.md
  EXPECT_EQ(model_preset("tiny-llama").num_parameters(), 125376);
  EXPECT_EQ(model_preset("gpt2-124m").num_parameters(), 124439808);
  EXPECT_EQ(model_preset("gpt2-350m").num_parameters(), 354823168);
  // BertForMaskedLM's (no pooler; the decoder tied, its bias counted).
  EXPECT_EQ(model_preset("bert-base").num_parameters(), 109514298);
  EXPECT_EQ(model_preset("bert-large").num_parameters(), 335174458);
  EXPECT_EQ(model_preset("llama3-8b").num_parameters(), 8030261248);
  EXPECT_EQ(model_preset("llama3-70b").num_parameters(), 70553706496);
  EXPECT_EQ(model_preset("llama3-405b").num_parameters(), 405853388800);
}

// The model cards' figures: total parameters (tied embeddings counted once) and, where the card
// gives it, the count without the embedding, in billions as published (rounded to the digits
// they print).
TEST(ModelConfig, FamilyPresetsHaveThePublishedParameterCounts) {
  EXPECT_EQ(model_preset("llama3.1-8b").num_parameters(), 8030261248);
  EXPECT_EQ(model_preset("llama3.2-1b").num_parameters(), 1235814400);
  EXPECT_EQ(model_preset("llama3.2-3b").num_parameters(), 3212749824);
  EXPECT_EQ(model_preset("mistral-7b").num_parameters(), 7248023552);
  struct Card {
    const char* preset;
    double total, non_embedding, digits;  // billions, rounded to `digits`
  };
  for (const Card& card :
       {Card{"qwen2.5-0.5b", 0.49, 0.36, 0.01}, Card{"qwen2.5-1.5b", 1.54, 1.31, 0.01},
        Card{"qwen3-0.6b", 0.6, 0.44, 0.1}, Card{"qwen3-1.7b", 1.7, 1.4, 0.1}}) {
    const ModelConfig c = model_preset(card.preset);
    const double total = static_cast<double>(c.num_parameters()) / 1e9;
    const double embedding = static_cast<double>(c.vocab_size * c.d_model) / 1e9;
    EXPECT_NEAR(total, card.total, card.digits / 2) << card.preset;
    EXPECT_NEAR(total - embedding, card.non_embedding, card.digits / 2) << card.preset;
  }
  // Qwen3's heads are wider than hidden_size / heads: q projects 1024 -> 16 x 128.
  const ModelConfig qwen3 = model_preset("qwen3-0.6b");
  EXPECT_EQ(qwen3.head_size(), 128);
  for (const auto& p : qwen3.parameter_shapes()) {
    if (p.name == "blocks.0.attn.q.weight") {
      EXPECT_EQ(p.shape, (std::vector<int64_t>{2048, 1024}));
    } else if (p.name == "blocks.0.attn.o.weight") {
      EXPECT_EQ(p.shape, (std::vector<int64_t>{1024, 2048}));
    }
  }
}

TEST(ModelConfig, PresetsAreValidAndNamed) {
  const auto names = model_preset_names();
  ASSERT_EQ(names.size(), 26u);
  for (const auto& name : names) {
    const ModelConfig config = model_preset(name);
    EXPECT_EQ(config.name, name);
    EXPECT_NO_THROW(config.validate()) << name;
  }
  EXPECT_EQ(model_preset("tiny").family, ModelFamily::kGpt2);
  EXPECT_EQ(model_preset("tiny-llama").family, ModelFamily::kLlama);
  EXPECT_EQ(model_preset("tiny-bert").family, ModelFamily::kBert);
  EXPECT_EQ(model_preset("tiny-llama").n_kv_heads, 2);
  EXPECT_FALSE(model_preset("tiny-llama").tie_embeddings);
  EXPECT_EQ(model_preset("llama3-405b").parameter_shapes().size(), 1u + 126u * 9u + 2u);
}

TEST(ModelConfig, UnknownPresetListsValidNames) {
  try {
    model_preset("gpt5");
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("gpt5"), std::string::npos) << msg;
    for (const auto& name : model_preset_names())
      EXPECT_NE(msg.find(name), std::string::npos) << msg;
  }
}

TEST(ModelConfig, FamilyNames) {
  EXPECT_EQ(to_string(ModelFamily::kGpt2), "gpt2");
  EXPECT_EQ(to_string(ModelFamily::kLlama), "llama");
  EXPECT_EQ(to_string(ModelFamily::kBert), "bert");
}

TEST(ModelConfig, ValidateNamesTheInconsistentField) {
  ModelConfig c = model_preset("tiny");
  c.d_model = 66;
  EXPECT_NE(validate_error(c).find("d_model 66 is not divisible by n_heads 4"), std::string::npos)
      << validate_error(c);

  c = model_preset("tiny-llama");
  c.n_kv_heads = 3;
  EXPECT_NE(validate_error(c).find("n_heads 4 is not divisible by n_kv_heads 3"), std::string::npos)
      << validate_error(c);

  c = model_preset("tiny");
  c.n_kv_heads = 2;
  EXPECT_NE(validate_error(c).find("n_kv_heads"), std::string::npos) << validate_error(c);

  c = model_preset("tiny");
  c.vocab_size = 0;
  EXPECT_NE(validate_error(c).find("vocab_size must be positive"), std::string::npos);

  c = model_preset("tiny");
  c.n_layers = -1;
  EXPECT_NE(validate_error(c).find("n_layers"), std::string::npos);

  c = model_preset("tiny");
  c.dropout = 1.0;
  EXPECT_NE(validate_error(c).find("dropout"), std::string::npos);

  c = model_preset("tiny-llama");
  c.d_model = 36;  // head size 9
  c.n_heads = 4;
  EXPECT_NE(validate_error(c).find("even"), std::string::npos) << validate_error(c);

  c = model_preset("tiny-bert");
  c.type_vocab_size = 0;
  EXPECT_NE(validate_error(c).find("type_vocab_size must be positive in the bert family"),
            std::string::npos);
  c = model_preset("tiny-bert");
  c.tie_embeddings = false;
  EXPECT_NE(validate_error(c).find("the bert family's head is tied"), std::string::npos);
  c = model_preset("tiny");
  c.type_vocab_size = 2;
  EXPECT_NE(validate_error(c).find("type_vocab_size belongs to the bert family, not gpt2"),
            std::string::npos);

  c = model_preset("tiny-llama");
  c.norm_eps = 0.0;
  EXPECT_NE(validate_error(c).find("norm_eps"), std::string::npos);

  // The module refuses an invalid configuration, and parameter_shapes() does not divide by zero.
  c = model_preset("tiny");
  c.n_heads = 0;
  EXPECT_THROW(c.parameter_shapes(), std::invalid_argument);
  EXPECT_THROW(Transformer{c}, std::invalid_argument);
}

}  // namespace config_test
}  // namespace shardtrain
