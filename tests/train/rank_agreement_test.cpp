// Ranks that disagree on their settings, or do not share the run directory, are refused at the
// start with a message naming them, before anything trains.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "shardtrain/rendezvous.h"
#include "shardtrain/train.h"
#include "support.h"
#include "train/run_config.h"

namespace shardtrain {
namespace rank_agreement_test {

namespace fs = std::filesystem;

class RankAgreementTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::fresh_test_dir("shardtrain_agreement");
    std::ofstream corpus(dir_ / "corpus.txt");
    for (int i = 0; i < 200; ++i) corpus << "how vexingly quick daft zebras jump " << i << ".\n";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Every rank's error (empty when it built its Trainer).
  std::vector<std::string> start(int world, const std::function<TrainConfig(int)>& config_of) {
    std::vector<std::string> errors(world);
    run_local_ranks(world, [&](ProcessGroup& group) {
      try {
        Trainer trainer(config_of(group.rank()),
                        std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {}));
      } catch (const std::exception& e) {
        errors[group.rank()] = e.what();
      }
    });
    return errors;
  }

  TrainConfig config(const fs::path& run, const std::vector<std::string>& more = {}) const {
    std::vector<std::string> all = {"parallel.strategy=\"ddp\"", "train.micro_batch=2",
                                    "train.steps=2"};
    all.insert(all.end(), more.begin(), more.end());
    return testing::tiny_run_config(dir_ / "corpus.txt", run, all);
  }

  fs::path dir_;
};

TEST_F(RankAgreementTest, SettingsThatDifferAreRefusedNamingTheRanks) {
  const auto errors = start(4, [&](int rank) {
    return config(dir_ / "run", rank == 1 || rank == 3 ? std::vector<std::string>{"train.lr=2e-3"}
                                                       : std::vector<std::string>{});
  });
  for (const auto& error : errors) {
    EXPECT_NE(error.find("rank(s) 1, 3 do not have rank 0's configuration"), std::string::npos)
        << error;
  }
  EXPECT_FALSE(fs::exists(dir_ / "run"));  // refused before the directory was touched
}

TEST_F(RankAgreementTest, ARunDirectoryNotSharedIsRefusedNamingTheRanks) {
  // Rank 1's run.dir is another directory: as a host whose storage is not rank 0's.
  const auto errors =
      start(2, [&](int rank) { return config(dir_ / ("run" + std::to_string(rank))); });
  for (const auto& error : errors) {
    EXPECT_NE(error.find("rank(s) 1 do not see rank 0's run directory"), std::string::npos)
        << error;
  }
  // The same directory through another path (a link to it) is the same storage.
  fs::create_directories(dir_ / "shared");
  fs::create_directory_symlink(dir_ / "shared", dir_ / "link");
  const auto fine = start(2, [&](int rank) { return config(dir_ / (rank ? "link" : "shared")); });
  for (const auto& error : fine) EXPECT_EQ(error, "");
}

}  // namespace rank_agreement_test
}  // namespace shardtrain
