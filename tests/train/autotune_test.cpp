// train.autotune: the micro-batch is measured within the range and batch limit it is given,
// every rank chooses the same one, the scratch runs are removed, and a range that cannot run
// says why; the CLI tunes before training when a ds_config's autotuning block asks for it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <mutex>

#include "shardtrain/rendezvous.h"
#include "shardtrain/train.h"
#include "support.h"
#include "train/run_config.h"

namespace shardtrain {
namespace autotune_test {

namespace fs = std::filesystem;

class AutotuneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::fresh_test_dir("shardtrain_autotune");
    testing::write_trainer_corpus(dir_ / "corpus.txt");
  }
  void TearDown() override { fs::remove_all(dir_); }

  TrainConfig config(std::vector<std::string> more) const {
    std::vector<std::string> all = {"train.autotune=true", "train.autotune_steps=3",
                                    "train.autotune_first_timed=2", "train.grad_accum=2"};
    all.insert(all.end(), more.begin(), more.end());
    return testing::tiny_run_config(dir_ / "corpus.txt", dir_ / "run", all);
  }

  fs::path dir_;
};

TEST_F(AutotuneTest, ChoosesWithinItsLimitsAndRemovesItsScratchRuns) {
  // micro x accumulation 2 x 1 rank <= 8: micro-batches 1, 2 and 4 at most.
  const TrainConfig chosen = autotune_micro_batch(
      config({"train.autotune_max_batch=8", "train.autotune_max_micro_batch=64"}), nullptr);
  EXPECT_TRUE(chosen.train.micro_batch == 1 || chosen.train.micro_batch == 2 ||
              chosen.train.micro_batch == 4)
      << chosen.train.micro_batch;
  EXPECT_FALSE(chosen.train.autotune);
  EXPECT_FALSE(fs::exists(dir_ / "run.autotune"));
  EXPECT_FALSE(fs::exists(dir_ / "run"));  // the run itself has not started
}

TEST_F(AutotuneTest, ARunDirectoryWithATrailingSlashIsLeftUntouched) {
  TrainConfig cfg = config({"train.autotune_max_micro_batch=2"});
  cfg.run.dir = (dir_ / "slash").string() + "/";
  autotune_micro_batch(cfg, nullptr);
  EXPECT_FALSE(fs::exists(dir_ / "slash"));
  EXPECT_FALSE(fs::exists(dir_ / "slash.autotune"));
}

TEST_F(AutotuneTest, ARestartTakesTheMicroBatchItsRunChose) {
  const TrainConfig cfg = config({});
  EXPECT_FALSE(micro_batch_of_run(cfg).has_value());  // no run yet: tune
  fs::create_directories(cfg.run.dir);
  std::ofstream(fs::path(cfg.run.dir) / "run.json") << R"({"train": {"micro_batch": 6}})";
  const auto chosen = micro_batch_of_run(cfg);
  ASSERT_TRUE(chosen.has_value());
  EXPECT_EQ(chosen->train.micro_batch, 6);
  EXPECT_FALSE(chosen->train.autotune);
  std::ofstream(fs::path(cfg.run.dir) / "run.json") << R"({"train": {}})";
  EXPECT_THROW(micro_batch_of_run(cfg), std::invalid_argument);
}

TEST_F(AutotuneTest, EveryRankChoosesTheSameMicroBatch) {
  std::vector<int64_t> chosen(2);
  std::mutex mutex;
  const TrainConfig cfg = config({"parallel.strategy=\"ddp\"", "train.autotune_max_micro_batch=8"});
  run_local_ranks(2, [&](ProcessGroup& group) {
    const TrainConfig mine =
        autotune_micro_batch(cfg, std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {}));
    std::lock_guard<std::mutex> lock(mutex);
    chosen[static_cast<size_t>(group.rank())] = mine.train.micro_batch;
  });
  EXPECT_EQ(chosen[0], chosen[1]);
  EXPECT_GE(chosen[0], 1);
  EXPECT_LE(chosen[0], 8);
}

TEST_F(AutotuneTest, ARangeThatCannotRunSaysWhy) {
  // Ten million sequences need terabytes: refused on any machine (a machine of 126 GiB ran
  // 100000 of them, slowly, instead of refusing).
  try {
    autotune_micro_batch(config({"train.autotune_min_micro_batch=10000000",
                                 "train.autotune_max_micro_batch=10000000"}),
                         nullptr);
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "train.autotune: the smallest micro-batch (10000000) cannot run: "),
              std::string::npos)
        << e.what();
  }
  try {
    autotune_micro_batch(config({"train.autotune_min_micro_batch=8", "train.autotune_max_batch=4"}),
                         nullptr);
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("no micro-batch from train.autotune_min_micro_batch (8) "
                                         "fits train.autotune_max_batch (4)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(testing::tiny_run_config(dir_ / "corpus.txt", dir_ / "r",
                                        {"train.autotune=true", "run.resume=\"latest\""}),
               std::invalid_argument);
}

TEST_F(AutotuneTest, TheCliTunesADeepSpeedFileThatAsksForItThenTrains) {
  const fs::path ds = dir_ / "ds.json";
  std::ofstream(ds) << R"({"train_micro_batch_size_per_gpu": "auto",
    "autotuning": {"enabled": true, "fast": true, "max_train_batch_size": 8,
                   "start_profile_step": 2, "end_profile_step": 3,
                   "arg_mappings": {"train_micro_batch_size_per_gpu": "--batch"}}})";
  const auto run = testing::run_command(
      testing::cli() + " train --config " + SHARDTRAIN_SOURCE_DIR +
      "/configs/zero_tiny.toml --deepspeed " + ds.string() + " --set data.corpus=" +
      (dir_ / "corpus.txt").string() + " --set run.dir=" + (dir_ / "cli").string() +
      " --set train.steps=1 --set train.grad_accum=1 --set train.sample_tokens=0");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("'train_micro_batch_size_per_gpu' tuned before training"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("autotune: micro-batch 1: "), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("autotune: train.micro_batch = "), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("autotune: micro-batch 16"), std::string::npos) << run.output;
  EXPECT_FALSE(fs::exists(dir_ / "cli.autotune"));
}

}  // namespace autotune_test
}  // namespace shardtrain
