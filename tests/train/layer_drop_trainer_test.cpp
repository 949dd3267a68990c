// train.layer_drop = "progressive" in the trainer: the first two steps are the plain run's, the
// later ones not; DDP over 2 ranks trains as one process does (every rank drops the same
// blocks, and the skipped blocks' zero gradients join the all-reduce), and so does a run with
// activation checkpointing; a resumed run drops what the whole run did; the layouts that gather or
// split blocks as they run are refused.
#include <gtest/gtest.h>

#include <cmath>

#include "shardtrain/train.h"
#include "train/trainer_run_test.h"

namespace shardtrain {
namespace layer_drop_trainer_test {

// theta 0.3 from the third step on (gamma large): the 2 blocks kept with probability 0.65 and 0.3.
const std::vector<std::string> kDrop = {"train.layer_drop=\"progressive\"",
                                        "train.layer_drop_theta=0.3", "train.layer_drop_gamma=1e6"};

class LayerDropTrainerTest : public testing::TrainerRunTest {
 protected:
  LayerDropTrainerTest() : TrainerRunTest(6) {}
};

TEST_F(LayerDropTrainerTest, DropsFromTheThirdStepAndTrainsUnderDdpAsOneProcess) {
  const auto plain = testing::train_on_ranks(1, config("plain", {}), 6);
  const auto dropped = testing::train_on_ranks(1, config("dropped", kDrop), 6);
  testing::expect_same_losses({dropped[0], dropped[1]}, {plain[0], plain[1]}, 1e-9);
  EXPECT_GT(std::abs(dropped[2] - plain[2]), 1e-4);
  for (double loss : dropped) EXPECT_TRUE(std::isfinite(loss));
  testing::expect_same_losses(testing::train_on_ranks(2, config("ddp", kDrop, "ddp"), 6), dropped,
                              1e-5);
  // Recomputed blocks see the scales their forward saw.
  std::vector<std::string> checkpointed = kDrop;
  checkpointed.push_back("train.activation_checkpointing=true");
  testing::expect_same_losses(testing::train_on_ranks(1, config("ac", checkpointed), 6), dropped,
                              1e-6);
}

TEST_F(LayerDropTrainerTest, EachStepReportsItsThetaAndTheBlocksItRan) {
  Trainer trainer(config("fields", kDrop), nullptr);
  std::vector<StepResult> steps;
  for (int i = 0; i < 6; ++i) steps.push_back(trainer.train_step());
  EXPECT_EQ(steps[0].layer_drop_theta, 1.0);
  EXPECT_EQ(steps[0].blocks_run, 2);
  EXPECT_EQ(steps[1].blocks_run, 2);
  int64_t run = 0;
  for (size_t i = 2; i < steps.size(); ++i) {
    EXPECT_NEAR(steps[i].layer_drop_theta, 0.3, 1e-12);
    EXPECT_GE(steps[i].blocks_run, 0);
    EXPECT_LE(steps[i].blocks_run, 2);
    run += steps[i].blocks_run;
  }
  EXPECT_LT(run, 8) << "no block was skipped in 4 steps";
  const StepResult plain = Trainer(config("plain", {}), nullptr).train_step();
  EXPECT_TRUE(std::isnan(plain.layer_drop_theta));
  EXPECT_EQ(plain.blocks_run, -1);
}

TEST_F(LayerDropTrainerTest, AResumedRunDropsWhatTheWholeRunDid) {
  expect_exact_resume(kDrop, 3, 6);
}

TEST_F(LayerDropTrainerTest, LayoutsThatGatherOrSplitBlocksAreRefused) {
  testing::expect_refused(
      2, [&] { return config("fsdp", kDrop, "fsdp"); }, "train.layer_drop = \"progressive\" runs");
  testing::expect_refused(
      2, [&] { return config("zero", kDrop, "zero"); }, "train.layer_drop = \"progressive\" runs");
  std::vector<std::string> tp = kDrop;
  tp.push_back("parallel.tp=2");
  tp.push_back("train.micro_batch=2");
  testing::expect_refused(
      2, [&] { return config("tp", tp); }, "(parallel.tp, pp, cp and ep must be 1)");
  testing::expect_refused(
      1,
      [&] {
        return config("theta", {kDrop[0], "train.layer_drop_theta=0"});
      },
      "train.layer_drop_theta must be in (0, 1]");
  testing::expect_refused(
      1, [&] { return config("kind", {"train.layer_drop=\"random\""}); },
      "train.layer_drop must be \"none\" or \"progressive\", got \"random\"");
}

}  // namespace layer_drop_trainer_test
}  // namespace shardtrain
