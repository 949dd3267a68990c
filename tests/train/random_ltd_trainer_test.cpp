// train.random_ltd_layers in the trainer: while the schedule keeps at least the whole sequence
// the run is the plain one, then not; DDP, FSDP and ZeRO-3 over 2 ranks train alike (each rank
// draws for its own forwards the same way under each), and so does a run with activation
// checkpointing; a resumed run draws what the whole run did; each step reports its token count;
// the layouts that split a block's tokens or weights are refused, and so are bad schedules.
#include <gtest/gtest.h>

#include <cmath>

#include "shardtrain/train.h"
#include "train/trainer_run_test.h"

namespace shardtrain {
namespace random_ltd_trainer_test {

class RandomLtdTrainerTest : public testing::TrainerRunTest {
 protected:
  RandomLtdTrainerTest() : TrainerRunTest(5) {}
};

TEST_F(RandomLtdTrainerTest, RunsWholeSequencesUntilTheScheduleKeepsFewerTokens) {
  const auto plain = testing::train_on_ranks(1, config("plain", {}), 5);
  // 32 of 32 tokens at every step: the plain run.
  const auto whole = testing::train_on_ranks(
      1,
      config("whole", {"train.random_ltd_layers=[0, 1]", "train.random_ltd_min=32",
                       "train.random_ltd_max=64", "train.random_ltd_steps=1000"}),
      5);
  testing::expect_same_losses(whole, plain, 1e-12);
  // 16 tokens from the first step in block 1 only.
  const auto dropped = testing::train_on_ranks(
      1,
      config("dropped", {"train.random_ltd_layers=[1]", "train.random_ltd_min=16",
                         "train.random_ltd_max=16", "train.random_ltd_steps=1"}),
      5);
  EXPECT_GT(std::abs(dropped[0] - plain[0]), 1e-4);
  for (double loss : dropped) EXPECT_TRUE(std::isfinite(loss));
  EXPECT_LT(dropped.back(), dropped.front());
}

const std::vector<std::string> kSixteen = {"train.random_ltd_layers=[1]", "train.random_ltd_min=16",
                                           "train.random_ltd_max=16", "train.random_ltd_steps=1"};

TEST_F(RandomLtdTrainerTest, DataParallelFsdpAndZeroTrainAlike) {
  const auto ddp = testing::train_on_ranks(2, config("ddp", kSixteen, "ddp"), 4);
  testing::expect_same_losses(testing::train_on_ranks(2, config("fsdp", kSixteen, "fsdp"), 4), ddp,
                              1e-5);
  std::vector<std::string> zero3 = kSixteen;
  zero3.push_back("parallel.zero.stage=3");
  testing::expect_same_losses(testing::train_on_ranks(2, config("zero", zero3, "zero"), 4), ddp,
                              1e-5);
  // Recomputed blocks see the tokens their forward saw.
  std::vector<std::string> checkpointed = kSixteen;
  checkpointed.push_back("train.activation_checkpointing=true");
  testing::expect_same_losses(testing::train_on_ranks(1, config("ac", checkpointed), 4),
                              testing::train_on_ranks(1, config("one", kSixteen), 4), 1e-6);
}

TEST_F(RandomLtdTrainerTest, AResumedRunDrawsWhatTheWholeRunDid) {
  expect_exact_resume(kSixteen, 2, 5);
}

TEST_F(RandomLtdTrainerTest, EachStepReportsItsTokens) {
  Trainer trainer(config("fields", {"train.random_ltd_layers=[0]", "train.random_ltd_min=8",
                                    "train.random_ltd_max=32", "train.random_ltd_steps=3",
                                    "train.random_ltd_step=8"}),
                  nullptr);
  std::vector<int64_t> tokens;
  for (int i = 0; i < 5; ++i) tokens.push_back(trainer.train_step().random_ltd_tokens);
  EXPECT_EQ(tokens, (std::vector<int64_t>{8, 16, 24, 32, 32}));
  EXPECT_EQ(Trainer(config("plain", {}), nullptr).train_step().random_ltd_tokens, -1);
}

TEST_F(RandomLtdTrainerTest, SplitLayoutsAndBadSchedulesAreRefused) {
  std::vector<std::string> tp = kSixteen;
  tp.push_back("parallel.tp=2");
  tp.push_back("train.micro_batch=2");
  testing::expect_refused(
      2, [&] { return config("tp", tp); }, "(parallel.tp, pp, cp and ep must be 1)");
  testing::expect_refused(
      1, [&] { return config("id", {"train.random_ltd_layers=[2]"}); },
      "train.random_ltd_layers: block 2 is not one of the model's blocks 0..1");
  testing::expect_refused(
      1, [&] { return config("twice", {"train.random_ltd_layers=[1, 1]"}); },
      "train.random_ltd_layers names block 1 twice");
  testing::expect_refused(
      1,
      [&] {
        return config("written",
                      {"train.random_ltd_layers=[1]", "train.random_ltd_model_layers=12"});
      },
      "train.random_ltd_model_layers = 12 (the blocks train.random_ltd_layers was written for) "
      "but model.n_layers = 2");
  testing::expect_refused(
      1,
      [&] {
        return config("range", {"train.random_ltd_layers=[1]", "train.random_ltd_min=64",
                                "train.random_ltd_max=32"});
      },
      "train.random_ltd_max must be >= train.random_ltd_min");
  testing::expect_refused(
      1,
      [&] {
        return config("both", {"train.random_ltd_layers=[1]", "train.layer_drop=\"progressive\""});
      },
      "use one of the two");
}

}  // namespace random_ltd_trainer_test
}  // namespace shardtrain
