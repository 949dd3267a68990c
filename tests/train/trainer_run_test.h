// A fixture for the trainer's feature tests: a fresh directory named after the test suite with
// the trainer corpus in it, runs of two micro-batches (testing::two_micro_batch_config) of
// `steps` steps there, and the exact-resume check they share.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "support.h"
#include "train/local_training.h"
#include "train/run_config.h"

namespace shardtrain::testing {

class TrainerRunTest : public ::testing::Test {
 protected:
  explicit TrainerRunTest(int64_t steps) : steps_(steps) {}

  void SetUp() override {
    dir_ =
        fresh_test_dir(std::string("shardtrain_") +
                       ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name());
    write_trainer_corpus(dir_ / "corpus.txt");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  TrainConfig config(const std::string& run, const std::vector<std::string>& more,
                     const std::string& strategy = "none") const {
    return two_micro_batch_config(dir_ / "corpus.txt", dir_ / run, steps_, strategy, more);
  }

  // One process with `settings`: `first` steps, then a run resumed from their checkpoint for the
  // rest of `total`, gives the uninterrupted run's losses. Returns the checkpoint's directory.
  std::string expect_exact_resume(const std::vector<std::string>& settings, int first,
                                  int total) const {
    const auto whole = train_on_ranks(1, config("whole", settings), total);
    std::string saved;
    train_on_ranks(1, config("first", settings), first, &saved);
    std::vector<std::string> resume = settings;
    resume.push_back("run.resume=\"" + saved + "\"");
    const auto resumed = train_on_ranks(1, config("resumed", resume), total - first);
    expect_same_losses(resumed, std::vector<double>(whole.begin() + first, whole.end()), 1e-9);
    return saved;
  }

  std::filesystem::path dir_;

 private:
  int64_t steps_;
};

}  // namespace shardtrain::testing
