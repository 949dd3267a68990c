// The BERT family in the trainer: masked-language-model training on a plain corpus whose losses
// are one process's under DDP, FSDP and ZeRO-3 over 2 ranks (the same sequences masked alike, the
// loss the mean over the global batch's masked positions), with activation checkpointing and
// FSDP's BertLayer wrap too; an exact resume; the layouts and data it does not train are refused.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "shardtrain/generate.h"
#include "shardtrain/hf.h"
#include "shardtrain/tensor_parallel.h"
#include "shardtrain/train.h"
#include "support.h"
#include "train/trainer_run_test.h"

namespace shardtrain {
namespace bert_trainer_test {

const std::vector<std::string> kBert = {"model.preset=\"tiny-bert\""};

std::vector<std::string> with(std::vector<std::string> settings,
                              const std::vector<std::string>& more) {
  settings.insert(settings.end(), more.begin(), more.end());
  return settings;
}

class BertTrainerTest : public testing::TrainerRunTest {
 protected:
  BertTrainerTest() : TrainerRunTest(4) {}
};

TEST_F(BertTrainerTest, DataParallelLayoutsTrainAsOneProcess) {
  const auto one = testing::train_on_ranks(1, config("one", kBert), 4);
  EXPECT_LT(one.back(), one.front());
  for (const std::string strategy : {"ddp", "fsdp", "zero"}) {
    SCOPED_TRACE(strategy);
    const auto settings = strategy == "zero" ? with(kBert, {"parallel.zero.stage=3"}) : kBert;
    testing::expect_same_losses(testing::train_on_ranks(2, config(strategy, settings, strategy), 4),
                                one, 1e-5);
  }
  const auto wrapped =
      with(kBert, {"train.activation_checkpointing=true", "parallel.fsdp.wrap=\"class\"",
                   "parallel.fsdp.wrap_classes=[\"BertLayer\"]"});
  testing::expect_same_losses(testing::train_on_ranks(2, config("wrapped", wrapped, "fsdp"), 4),
                              one, 1e-5);
}

TEST_F(BertTrainerTest, ResumesExactly) {
  const std::string saved = expect_exact_resume(kBert, 2, 4);
  // The checkpoint is a masked-language model: no text continues from it.
  Transformer model = load_trained_model(saved);
  EXPECT_EQ(model->config().family, ModelFamily::kBert);
  const auto tokenizer = make_byte_tokenizer();
  EXPECT_NE(testing::invalid_argument_of([&] {
              generate_text(model, *tokenizer, nullptr, "a", SampleOptions().tokens(4));
            }).find("is a masked-language model"),
            std::string::npos);
}

// LoRA on every linear layer: two ranks train as one process, and the PEFT export names its
// layers by their whole Hugging Face names (BERT's "dense" layers are of four kinds) and no
// causal-LM task.
TEST_F(BertTrainerTest, LoraTrainsAsOneProcessAndExportsForPeft) {
  const auto lora = with(kBert, {"lora.rank=4", "lora.alpha=8"});
  std::string saved;
  const auto one = testing::train_on_ranks(1, config("lora_one", lora), 4, &saved);
  testing::expect_same_losses(testing::train_on_ranks(2, config("lora_ddp", lora, "ddp"), 4), one,
                              1e-5);
  const auto out = dir_ / "adapters";
  export_lora_checkpoint(saved, out.string(), LoraExport::kAdapters);
  nlohmann::json adapter;
  std::ifstream(out / "adapter_config.json") >> adapter;
  EXPECT_FALSE(adapter.contains("task_type"));
  const auto targets = adapter.at("target_modules").get<std::vector<std::string>>();
  for (const char* name :
       {"bert.encoder.layer.0.attention.output.dense", "bert.encoder.layer.1.output.dense",
        "bert.encoder.layer.1.intermediate.dense", "bert.encoder.layer.0.attention.self.query",
        "cls.predictions.transform.dense"}) {
    EXPECT_NE(std::find(targets.begin(), targets.end(), name), targets.end()) << name;
  }
  EXPECT_EQ(std::find(targets.begin(), targets.end(), "dense"), targets.end());
}

TEST_F(BertTrainerTest, WhatItDoesNotTrainIsRefused) {
  for (const auto& [setting, words] : std::vector<std::pair<std::string, std::string>>{
           {"parallel.tp=2", "parallel.tp, pp, cp and ep must be 1 for the bert family"},
           {"data.format=\"chat\"", "it trains on masked tokens of a plain corpus"},
           {"train.random_ltd_layers=[1]", "random layer-token dropping is implemented for"},
           {"train.mlm_probability=0", "train.mlm_probability must be in (0, 1]"}}) {
    SCOPED_TRACE(setting);
    EXPECT_NE(testing::invalid_argument_of([&] {
                config("refused", with(kBert, {setting}));
              }).find(words),
              std::string::npos);
  }
  // Its heads are its key/value heads, as GPT-2's: a head count set alone changes both.
  EXPECT_EQ(config("heads", with(kBert, {"model.n_heads=8"})).model.n_kv_heads, 8);
  // No tensor-parallel plan for it, from the library either.
  EXPECT_NE(testing::invalid_argument_of([&] {
              transformer_tp_plan(model_preset("tiny-bert"), 2);
            }).find("has no tensor-parallel plan"),
            std::string::npos);
  // The byte tokenizer has no mask token: the model's vocabulary needs a row for one.
  EXPECT_NE(testing::invalid_argument_of([&] {
              Trainer trainer(config("small", with(kBert, {"model.vocab_size=257"})));
            }).find("plus the mask token the bert family trains with"),
            std::string::npos);
}

}  // namespace bert_trainer_test
}  // namespace shardtrain
