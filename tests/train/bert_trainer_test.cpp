// The BERT family in the trainer: masked-language-model training on a plain corpus whose losses
// are one process's under DDP, FSDP and ZeRO-3 over 2 ranks (the same sequences masked alike, the
// loss the mean over the global batch's masked positions), with activation checkpointing and
// FSDP's BertLayer wrap too; an exact resume; the layouts and data it does not train are refused.
#include <gtest/gtest.h>

#include "shardtrain/generate.h"
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
  // The byte tokenizer has no mask token: the model's vocabulary needs a row for one.
  EXPECT_NE(testing::invalid_argument_of([&] {
              Trainer trainer(config("small", with(kBert, {"model.vocab_size=257"})));
            }).find("plus the mask token the bert family trains with"),
            std::string::npos);
}

}  // namespace bert_trainer_test
}  // namespace shardtrain
