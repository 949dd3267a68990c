// train.optimizer = "lamb", "onebit_adam", "onebit_lamb" and "zero_one_adam" in the trainer: data
// parallelism trains as one process does on the same global batch, 1-bit Adam's and 0/1 Adam's
// compression keeps the replicas equal while sending less, runs resume exactly, and the
// strategies that shard are refused.
#include <gtest/gtest.h>

#include <filesystem>
#include <mutex>

#include "shardtrain/rendezvous.h"
#include "shardtrain/sharded_checkpoint.h"
#include "shardtrain/train.h"
#include "support.h"
#include "train/local_training.h"
#include "train/run_config.h"

namespace shardtrain {
namespace optimizers_trainer_test {

namespace fs = std::filesystem;

class OptimizersTrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::fresh_test_dir("shardtrain_optimizers");
    testing::write_trainer_corpus(dir_ / "corpus.txt");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Two micro-batches of 2 sequences per step on one process; `ddp` splits each over 2 ranks.
  TrainConfig config(const std::string& run, const std::vector<std::string>& optimizer, bool ddp,
                     std::vector<std::string> more = {}) const {
    std::vector<std::string> all = {"train.grad_accum=2", "train.steps=4", "train.lr=3e-3"};
    all.insert(all.end(), optimizer.begin(), optimizer.end());
    if (ddp) {
      all.push_back("parallel.strategy=\"ddp\"");
      all.push_back("train.micro_batch=1");
    } else {
      all.push_back("train.micro_batch=2");
    }
    all.insert(all.end(), more.begin(), more.end());
    return testing::tiny_run_config(dir_ / "corpus.txt", dir_ / run, all);
  }

  fs::path dir_;
};

// Two in-process ranks training `cfg` for `steps` steps: rank 0's results and each rank's
// parameters afterwards.
struct TwoRanks {
  std::vector<StepResult> steps;
  std::vector<std::vector<at::Tensor>> params = std::vector<std::vector<at::Tensor>>(2);
};

TwoRanks train_two_ranks(const TrainConfig& cfg, int steps) {
  TwoRanks out;
  std::mutex mutex;
  run_local_ranks(2, [&](ProcessGroup& group) {
    Trainer trainer(cfg, std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {}));
    std::vector<StepResult> mine;
    for (int i = 0; i < steps; ++i) mine.push_back(trainer.train_step());
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& p : trainer.model()->parameters())
      out.params[group.rank()].push_back(p.clone());
    if (group.rank() == 0) out.steps = mine;
  });
  return out;
}

// The replicas hold bit-for-bit the same parameters.
void expect_equal_replicas(const TwoRanks& run) {
  ASSERT_EQ(run.params[0].size(), run.params[1].size());
  for (size_t i = 0; i < run.params[0].size(); ++i) {
    EXPECT_TRUE(run.params[0][i].equal(run.params[1][i])) << "parameter " << i;
  }
}

const std::vector<std::string> kLamb = {"train.optimizer=\"lamb\"", "train.lamb_max_coeff=0.3"};
const std::vector<std::string> kOneBit = {"train.optimizer=\"onebit_adam\"",
                                          "train.bias_correction=false"};

TEST_F(OptimizersTrainerTest, LambUnderDdpTrainsAsOneProcess) {
  const auto one = testing::train_on_ranks(1, config("one", kLamb, false), 4);
  testing::expect_same_losses(testing::train_on_ranks(2, config("ddp", kLamb, true), 4), one, 1e-5);
  // Not AdamW under another name.
  const auto adamw = testing::train_on_ranks(1, config("adamw", {}, false), 4);
  EXPECT_GT(std::abs(adamw.back() - one.back()), 1e-4);
}

TEST_F(OptimizersTrainerTest, LambResumesExactly) {
  const auto whole = testing::train_on_ranks(2, config("whole", kLamb, true), 4);
  std::string saved;
  testing::train_on_ranks(2, config("first", kLamb, true), 2, &saved);
  const auto resumed = testing::train_on_ranks(
      2, config("resumed", kLamb, true, {"run.resume=\"" + saved + "\""}), 2);
  testing::expect_same_losses(resumed, {whole[2], whole[3]}, 1e-6);
}

TEST_F(OptimizersTrainerTest, OneBitAdamWarmupUnderDdpTrainsAsOneProcess) {
  std::vector<std::string> warm = kOneBit;
  warm.push_back("train.freeze_step=100");
  const auto one = testing::train_on_ranks(1, config("one", warm, false), 4);
  testing::expect_same_losses(testing::train_on_ranks(2, config("ddp", warm, true), 4), one, 1e-5);
}

TEST_F(OptimizersTrainerTest, OneBitAdamCompressionKeepsReplicasEqualAndSendsLess) {
  std::vector<std::string> onebit = kOneBit;
  onebit.push_back("train.freeze_step=2");
  const TwoRanks run = train_two_ranks(config("onebit", onebit, true, {"train.steps=6"}), 6);
  const std::vector<StepResult>& steps = run.steps;
  ASSERT_EQ(steps.size(), 6u);
  for (const auto& step : steps) EXPECT_TRUE(std::isfinite(step.loss)) << "step " << step.step;
  EXPECT_LT(steps.back().loss, steps.front().loss);
  // Warmup steps all-reduce fp32 gradients; compressed ones send about 2 bits per element.
  const double warm = static_cast<double>(steps[1].comm_bytes);
  for (size_t i = 2; i < steps.size(); ++i) {
    EXPECT_LT(static_cast<double>(steps[i].comm_bytes), warm / 8) << "step " << steps[i].step;
  }
  expect_equal_replicas(run);
}

const std::vector<std::string> kOneBitLamb = {
    "train.optimizer=\"onebit_lamb\"", "train.bias_correction=false", "train.lamb_max_coeff=0.3"};

TEST_F(OptimizersTrainerTest, OneBitLambCompressionKeepsReplicasEqual) {
  std::vector<std::string> onebit = kOneBitLamb;
  onebit.push_back("train.freeze_step=2");
  const TwoRanks run = train_two_ranks(config("onebit_lamb", onebit, true, {"train.steps=5"}), 5);
  ASSERT_EQ(run.steps.size(), 5u);
  for (const auto& step : run.steps) EXPECT_TRUE(std::isfinite(step.loss)) << "step " << step.step;
  expect_equal_replicas(run);
}

TEST_F(OptimizersTrainerTest, OneBitLambResumesPastItsWarmupExactly) {
  // One process averages nothing, so its compressed phase carries no compression error: a
  // resume is exact when the frozen ratio, the fresh variance, the last factor and the scaling
  // come back from the checkpoint.
  std::vector<std::string> onebit = kOneBitLamb;
  onebit.push_back("train.freeze_step=2");
  const auto whole =
      testing::train_on_ranks(1, config("whole", onebit, false, {"train.steps=5"}), 5);
  std::string saved;
  testing::train_on_ranks(1, config("first", onebit, false, {"train.steps=5"}), 3, &saved);
  ASSERT_NE(ShardedCheckpointReader(saved).find("optim.blocks.0.mlp.fc.weight.exp_avg_sq_fresh"),
            nullptr);
  const auto resumed = testing::train_on_ranks(
      1, config("resumed", onebit, false, {"train.steps=5", "run.resume=\"" + saved + "\""}), 2);
  testing::expect_same_losses(resumed, {whole[3], whole[4]}, 1e-6);
}

const std::vector<std::string> kZeroOne = {"train.optimizer=\"zero_one_adam\"",
                                           "train.bias_correction=false"};

TEST_F(OptimizersTrainerTest, ZeroOneAdamAveragingEveryStepUnderDdpTrainsAsOneProcess) {
  // Variance updated every step and never frozen: every step's gradients are averaged.
  std::vector<std::string> averaged = kZeroOne;
  averaged.push_back("train.var_update_scaler=1000");
  averaged.push_back("train.var_freeze_step=1000");
  const auto one = testing::train_on_ranks(1, config("one", averaged, false), 4);
  testing::expect_same_losses(testing::train_on_ranks(2, config("ddp", averaged, true), 4), one,
                              1e-5);
}

TEST_F(OptimizersTrainerTest, ZeroOneAdamCompressionAndLocalStepsKeepReplicasEqual) {
  // Variance updates at steps 1, 2 and 4, compressed averages at 3 and 5, then local steps
  // exchanged every step (clipper 1).
  std::vector<std::string> zero_one = kZeroOne;
  zero_one.push_back("train.var_update_scaler=1");
  zero_one.push_back("train.var_freeze_step=4");
  zero_one.push_back("train.local_step_clipper=1");
  const TwoRanks run = train_two_ranks(config("zero_one", zero_one, true, {"train.steps=8"}), 8);
  ASSERT_EQ(run.steps.size(), 8u);
  for (const auto& step : run.steps) EXPECT_TRUE(std::isfinite(step.loss)) << "step " << step.step;
  // A variance update all-reduces fp32 gradients; a compressed step sends about 2 bits each.
  const double full = static_cast<double>(run.steps[3].comm_bytes);
  for (size_t i : {2, 4, 6, 7}) {
    EXPECT_LT(static_cast<double>(run.steps[i].comm_bytes), full / 8) << "step " << i + 1;
  }
  expect_equal_replicas(run);
}

TEST_F(OptimizersTrainerTest, ZeroOneAdamResumesBetweenExchangesExactly) {
  // One process: no compression error; the counters, the learning-rate sum and the parameters
  // at the last exchange come back from the checkpoint, mid-way between two exchanges.
  std::vector<std::string> zero_one = kZeroOne;
  zero_one.push_back("train.var_update_scaler=1");
  zero_one.push_back("train.var_freeze_step=2");
  zero_one.push_back("train.local_step_scaler=1");
  zero_one.push_back("train.local_step_clipper=4");
  const auto whole =
      testing::train_on_ranks(1, config("whole", zero_one, false, {"train.steps=9"}), 9);
  std::string saved;
  testing::train_on_ranks(1, config("first", zero_one, false, {"train.steps=9"}), 6, &saved);
  ASSERT_NE(ShardedCheckpointReader(saved).find("optim.blocks.0.mlp.fc.weight.local_start"),
            nullptr);
  const auto resumed = testing::train_on_ranks(
      1, config("resumed", zero_one, false, {"train.steps=9", "run.resume=\"" + saved + "\""}), 3);
  testing::expect_same_losses(resumed, {whole[6], whole[7], whole[8]}, 1e-6);
}

TEST_F(OptimizersTrainerTest, ShardingStrategiesAndBadSettingsAreRefused) {
  testing::expect_refused(
      2, [&] { return config("fsdp", kLamb, true, {"parallel.strategy=\"fsdp\""}); },
      "train.optimizer = \"lamb\" with parallel.strategy = \"fsdp\"");
  testing::expect_refused(
      2,
      [&] {
        return config("zero", kOneBit, true,
                      {"parallel.strategy=\"zero\"", "parallel.zero.stage=2"});
      },
      "train.optimizer = \"onebit_adam\" with parallel.strategy = \"zero\"");
  testing::expect_refused(
      1, [&] { return config("bc", {"train.optimizer=\"onebit_adam\""}, false); },
      "set train.bias_correction = false");
  testing::expect_refused(
      1, [&] { return config("sgd", {"train.optimizer=\"sgd\""}, false); },
      "train.optimizer must be \"adamw\", \"lamb\", \"onebit_adam\", \"onebit_lamb\" or "
      "\"zero_one_adam\", got \"sgd\"");
  testing::expect_refused(
      1,
      [&] {
        std::vector<std::string> bad = kZeroOne;
        bad.push_back("train.local_step_clipper=0");
        return config("clipper", bad, false);
      },
      "train.local_step_clipper must be >= 1");
  testing::expect_refused(
      1,
      [&] {
        return config(
            "coeff",
            {"train.optimizer=\"lamb\"", "train.lamb_min_coeff=0.5", "train.lamb_max_coeff=0.3"},
            false);
      },
      "train.lamb_min_coeff must be positive and at most train.lamb_max_coeff");
  const std::vector<std::string> onebit_lamb = {"train.optimizer=\"onebit_lamb\"",
                                                "train.bias_correction=false"};
  auto with = [&](std::string setting) {
    std::vector<std::string> all = onebit_lamb;
    all.push_back(std::move(setting));
    return all;
  };
  testing::expect_refused(
      1, [&] { return config("beta", with("train.lamb_coeff_beta=1.0"), false); },
      "train.lamb_coeff_beta must be in [0, 1)");
  testing::expect_refused(
      1, [&] { return config("factor", with("train.lamb_factor_min=5.0"), false); },
      "train.lamb_factor_min must be positive and at most train.lamb_factor_max");
  testing::expect_refused(
      1, [&] { return config("freeze", with("train.freeze_step=-1"), false); },
      "train.freeze_step must be >= 0");
}

}  // namespace optimizers_trainer_test
}  // namespace shardtrain
