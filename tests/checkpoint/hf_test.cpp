// Hugging Face export and import: names and layouts checked against the HF conventions, and an
// exported checkpoint starting a new run with the same outputs.
#include "shardtrain/hf.h"

#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>

#include "shardtrain/checkpoint.h"
#include "shardtrain/fsdp.h"
#include "shardtrain/rendezvous.h"
#include "shardtrain/train.h"
#include "support.h"

namespace shardtrain {
namespace hf_test {

namespace fs = std::filesystem;

class HfTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = testing::fresh_test_dir("shardtrain_hf");
    std::ofstream corpus(dir_ / "corpus.txt");
    for (int i = 0; i < 100; ++i) corpus << "to be or not to be " << i % 9 << ", that is it.\n";
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::vector<std::string> base(const std::string& run) const {
    return {"data.corpus=\"" + (dir_ / "corpus.txt").string() + "\"",
            "run.dir=\"" + (dir_ / run).string() + "\"",
            "data.seq_len=16",
            "train.micro_batch=2",
            "train.sample_tokens=0",
            "data.eval_sequences=2"};
  }

  fs::path dir_;
};

TEST_P(HfTest, ExportedCheckpointStartsARunWithTheSameOutputs) {
  const std::string preset = GetParam();
  Trainer trained(
      parse_train_config("[model]\npreset = \"" + preset + "\"\n", "a.toml", base("trained")));
  for (int i = 0; i < 2; ++i) trained.train_step();
  const std::string checkpoint = trained.save_checkpoint();
  const std::string out = (dir_ / "hf").string();
  export_hf_checkpoint(checkpoint, out);

  // The names and layouts are Hugging Face's: GPT-2's Conv1D holds the transpose of our
  // Linear weights, with q, k, v fused in that order; Llama's projections are ours unchanged.
  const auto hf = load_safetensors(out + "/model.safetensors");
  auto params = trained.model()->named_parameters();
  const ModelConfig& c = trained.model()->config();
  if (c.family == ModelFamily::kGpt2) {
    EXPECT_EQ(hf.size(), 4 + 12 * static_cast<size_t>(c.n_layers));  // tied head: no lm_head
    const at::Tensor c_attn = hf.at("transformer.h.1.attn.c_attn.weight");
    EXPECT_TRUE(c_attn.sizes().equals({c.d_model, 3 * c.d_model}));
    const at::Tensor qkv = params["blocks.1.attn.qkv.weight"];
    EXPECT_TRUE(at::equal(c_attn.narrow(1, c.d_model, c.d_model),
                          qkv.narrow(0, c.d_model, c.d_model).t()));  // the key block
    EXPECT_TRUE(
        at::equal(hf.at("transformer.h.0.mlp.c_fc.weight"), params["blocks.0.mlp.fc.weight"].t()));
    EXPECT_TRUE(at::equal(hf.at("transformer.wte.weight"), params["tok_emb.weight"]));
  } else if (c.family == ModelFamily::kBert) {
    // BertForMaskedLM's names, every tensor unchanged; the decoder tied (no tensor of its own).
    EXPECT_EQ(hf.size(), c.parameter_shapes().size());
    for (const HfParameterName& name : hf_parameter_names(c)) {
      ASSERT_EQ(hf.count(name.hf_name), 1u) << name.hf_name;
      EXPECT_TRUE(at::equal(hf.at(name.hf_name), params[name.name])) << name.hf_name;
    }
    EXPECT_TRUE(at::equal(hf.at("bert.encoder.layer.1.attention.self.key.weight"),
                          params["blocks.1.attn.k.weight"]));
    EXPECT_TRUE(at::equal(hf.at("bert.encoder.layer.0.output.LayerNorm.bias"),
                          params["blocks.0.mlp_norm.bias"]));
    EXPECT_TRUE(at::equal(hf.at("cls.predictions.bias"), params["mlm.bias"]));
    EXPECT_EQ(hf.count("cls.predictions.decoder.weight"), 0u);
  } else {
    // Every tensor under its Hugging Face name, unchanged (a tied head has no lm_head).
    EXPECT_EQ(hf.size(), c.parameter_shapes().size());
    for (const HfParameterName& name : hf_parameter_names(c)) {
      ASSERT_EQ(hf.count(name.hf_name), 1u) << name.hf_name;
      EXPECT_TRUE(at::equal(hf.at(name.hf_name), params[name.name])) << name.hf_name;
    }
    EXPECT_TRUE(at::equal(hf.at("model.layers.1.self_attn.k_proj.weight"),
                          params["blocks.1.attn.k.weight"]));
    EXPECT_TRUE(at::equal(hf.at("model.layers.0.post_attention_layernorm.weight"),
                          params["blocks.0.ffn_norm.weight"]));
    EXPECT_EQ(hf.count("lm_head.weight"), c.tie_embeddings ? 0u : 1u);
    EXPECT_EQ(hf.count("model.layers.0.self_attn.q_proj.bias"), c.attention_bias ? 1u : 0u);
    EXPECT_EQ(hf.count("model.layers.0.self_attn.q_norm.weight"), c.qk_norm ? 1u : 0u);
  }
  const ModelConfig read_back = model_config_from_hf_json(out + "/config.json");
  EXPECT_NE(hf_config_json(c, at::kBFloat16).find("\"torch_dtype\": \"bfloat16\""),
            std::string::npos);
  EXPECT_EQ(read_back.parameter_shapes().size(), c.parameter_shapes().size());
  EXPECT_EQ(read_back.n_kv_heads, c.n_kv_heads);
  EXPECT_EQ(read_back.tie_embeddings, c.tie_embeddings);
  EXPECT_EQ(read_back.num_parameters(), c.num_parameters());
  EXPECT_EQ(read_back.model_type(), c.model_type());
  EXPECT_EQ(read_back.head_size(), c.head_size());
  EXPECT_EQ(read_back.attention_bias, c.attention_bias);
  EXPECT_EQ(read_back.qk_norm, c.qk_norm);
  EXPECT_EQ(read_back.sliding_window, c.sliding_window);
  EXPECT_DOUBLE_EQ(read_back.rope_scaling.factor, c.rope_scaling.factor);
  EXPECT_EQ(read_back.rope_scaling.original_context_length, c.rope_scaling.original_context_length);
  EXPECT_EQ(read_back.type_vocab_size, c.type_vocab_size);
  EXPECT_EQ(read_back.family, c.family);

  auto overrides = base("imported");
  overrides.push_back("model.hf_config=\"" + out + "/config.json\"");
  overrides.push_back("model.init_from=\"" + out + "\"");
  Trainer imported(parse_train_config("", "b.toml", overrides));
  const at::Tensor tokens = at::arange(12, at::kLong).view({2, 6}) * 7 % 257;
  torch::NoGradGuard no_grad;
  trained.model()->eval();
  imported.model()->eval();
  EXPECT_TRUE(at::equal(trained.model()->forward(tokens), imported.model()->forward(tokens)));
  // Every tensor came back as it was exported.
  auto imported_params = imported.model()->named_parameters();
  for (const auto& item : params) {
    EXPECT_TRUE(at::equal(imported_params[item.key()], item.value())) << item.key();
  }
  // A fresh model of the same seed differs: the outputs came from the imported weights.
  Trainer fresh(
      parse_train_config("[model]\npreset = \"" + preset + "\"\n", "c.toml", base("fresh")));
  fresh.model()->eval();
  EXPECT_FALSE(at::equal(fresh.model()->forward(tokens), imported.model()->forward(tokens)));
}

INSTANTIATE_TEST_SUITE_P(Families, HfTest,
                         ::testing::Values("tiny", "tiny-bert", "tiny-llama", "tiny-llama3.2",
                                           "tiny-qwen2", "tiny-qwen3", "tiny-mistral", "tiny-moe",
                                           "tiny-qwen3-moe"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& ch : name) ch = std::isalnum(ch) ? ch : '_';
                           return name;
                         });

TEST(HfImportTest, ShardedRanksStreamTheirSlicesFromSplitFiles) {
  // Weights split over two files with an index, as large Hugging Face models are; 3 ranks of a
  // deferred model under full_shard each read their shards and hold exactly those slices.
  const fs::path dir = testing::fresh_test_dir("shardtrain_hf_stream");
  for (const std::string preset : {"tiny", "tiny-llama"}) {
    SCOPED_TRACE(preset);
    const ModelConfig config = model_preset(preset);
    Transformer source(config, ModelInit().seed(99));
    auto params = source->named_parameters();
    NamedTensors first, second;
    nlohmann::json index;
    size_t k = 0;
    for (const auto& n : hf_parameter_names(config)) {
      const at::Tensor value = n.transposed ? params[n.name].t().contiguous() : params[n.name];
      const bool in_first = k++ % 2 == 0;
      (in_first ? first : second).emplace_back(n.hf_name, value.to(at::kBFloat16));
      index["weight_map"][n.hf_name] = in_first ? "part-1.safetensors" : "part-2.safetensors";
    }
    const fs::path folder = dir / preset;
    fs::create_directories(folder);
    save_safetensors((folder / "part-1.safetensors").string(), first);
    save_safetensors((folder / "part-2.safetensors").string(), second);
    std::ofstream(folder / "model.safetensors.index.json") << index.dump();

    std::mutex mutex;
    std::vector<std::string> wrong;
    run_local_ranks(3, [&](ProcessGroup& group) {
      auto shared = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
      DeviceMesh mesh(shared, MeshShape());
      Transformer model(config,
                        ModelInit().deferred().values(hf_initializer(config, folder.string())));
      auto fsdp = flat_shard(model, mesh, FSDPOptions());
      std::lock_guard<std::mutex> lock(mutex);
      for (const auto& s : fsdp->segments()) {
        const at::Tensor want = params[s.name]
                                    .detach()
                                    .to(at::kBFloat16)
                                    .to(at::kFloat)
                                    .reshape({-1})
                                    .narrow(0, s.offset, s.param.numel());
        if (!at::equal(s.param.detach(), want)) wrong.push_back(s.name);
      }
    });
    EXPECT_TRUE(wrong.empty()) << wrong.front();
  }
  fs::remove_all(dir);
}

// BERT checkpoints as Hugging Face keeps them: BertForPreTraining's pooler and next-sentence head
// and the tied decoder beside the masked-language model, and older files' LayerNorm gamma and
// beta. The model's parameters come back; the pooler and the next-sentence head are left out.
TEST(HfImportTest, BertCheckpointsWithPoolerAndOldNormNamesImport) {
  const fs::path dir = testing::fresh_test_dir("shardtrain_hf_bert");
  const ModelConfig config = model_preset("tiny-bert");
  Transformer model(config, ModelInit().seed(9));
  NamedTensors tensors;
  for (const auto& n : hf_parameter_names(config)) {
    std::string name = n.hf_name;
    for (const auto& [from, to] :
         {std::pair<std::string, std::string>{"LayerNorm.weight", "LayerNorm.gamma"},
          {"LayerNorm.bias", "LayerNorm.beta"}}) {
      if (name.size() > from.size() &&
          name.compare(name.size() - from.size(), from.size(), from) == 0) {
        name = name.substr(0, name.size() - from.size()) + to;
      }
    }
    tensors.emplace_back(name, model->named_parameters()[n.name].detach());
  }
  tensors.emplace_back("bert.pooler.dense.weight", at::zeros({config.d_model, config.d_model}));
  tensors.emplace_back("cls.seq_relationship.weight", at::zeros({2, config.d_model}));
  tensors.emplace_back("cls.predictions.decoder.weight",
                       model->named_parameters()["tok_emb.weight"].detach());
  tensors.emplace_back("bert.embeddings.position_ids", at::arange(config.context_length));
  save_safetensors((dir / "model.safetensors").string(), tensors);
  Transformer imported(config, ModelInit().seed(10));
  load_hf_weights(imported, (dir / "model.safetensors").string());
  for (const auto& item : model->named_parameters()) {
    EXPECT_TRUE(at::equal(imported->named_parameters()[item.key()], item.value())) << item.key();
  }
  fs::remove_all(dir);
}

TEST(HfImportTest, MissingAndMisshapenTensorsAreNamed) {
  const fs::path dir = testing::fresh_test_dir("shardtrain_hf_import");
  ModelConfig config = model_preset("tiny");
  Transformer model(config);
  NamedTensors tensors;
  for (const auto& n : hf_parameter_names(config)) {
    at::Tensor t = model->named_parameters()[n.name].detach();
    tensors.emplace_back(n.hf_name, n.transposed ? t.t().contiguous() : t);
  }
  // The original GPT-2 files carry no "transformer." prefix and a causal-mask buffer per layer.
  NamedTensors unprefixed;
  for (const auto& [name, t] : tensors) unprefixed.emplace_back(name.substr(12), t);
  unprefixed.emplace_back("h.0.attn.bias", at::ones({1, 1, 4, 4}));
  save_safetensors((dir / "plain.safetensors").string(), unprefixed);
  Transformer other(config);
  load_hf_weights(other, (dir / "plain.safetensors").string());
  EXPECT_TRUE(at::equal(other->named_parameters()["blocks.1.mlp.proj.weight"],
                        model->named_parameters()["blocks.1.mlp.proj.weight"]));

  auto message = [&](NamedTensors edited) {
    save_safetensors((dir / "bad.safetensors").string(), edited);
    try {
      load_hf_weights(other, (dir / "bad.safetensors").string());
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  NamedTensors missing = tensors;
  missing.erase(missing.begin() + 5);  // transformer.h.0.attn.c_attn.bias
  EXPECT_NE(message(missing).find("no tensor 'transformer.h.0.attn.c_attn.bias'"),
            std::string::npos)
      << message(missing);
  NamedTensors unshaped = tensors;
  unshaped[4].second = unshaped[4].second.t().contiguous();  // c_attn.weight as a Linear
  EXPECT_NE(message(unshaped).find("'transformer.h.0.attn.c_attn.weight'"), std::string::npos)
      << message(unshaped);
  NamedTensors extra = tensors;
  extra.emplace_back("transformer.h.2.ln_1.weight", at::ones({64}));
  EXPECT_NE(message(extra).find("'transformer.h.2.ln_1.weight'"), std::string::npos)
      << message(extra);
  EXPECT_THROW(load_hf_weights(other, (dir / "none").string()), std::invalid_argument);
  fs::remove_all(dir);
}

}  // namespace hf_test
}  // namespace shardtrain
