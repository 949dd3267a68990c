// Checkpoints written under one strategy and world size, resumed under another: DDP, FSDP
// full_shard, ZeRO-2 and ZeRO-3 at 4 ranks, each continued under a different strategy at 2 and
// at 3 ranks, with the losses of the uninterrupted run.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "shardtrain/rendezvous.h"
#include "shardtrain/train.h"
#include "support.h"
#include "train/run_config.h"

namespace shardtrain {
namespace reshard_resume_test {

namespace fs = std::filesystem;

constexpr int kGlobalBatch = 12;  // divisible by 1, 2, 3 and 4 ranks

struct Layout {
  std::string name;
  std::vector<std::string> keys;
};

Layout ddp() { return {"ddp", {"parallel.strategy=\"ddp\""}}; }
Layout fsdp() { return {"fsdp", {"parallel.strategy=\"fsdp\""}}; }
Layout zero(int stage) {
  return {"zero" + std::to_string(stage),
          {"parallel.strategy=\"zero\"", "parallel.zero.stage=" + std::to_string(stage)}};
}

class ReshardResumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::fresh_test_dir("shardtrain_reshard");
    std::ofstream corpus(dir_ / "corpus.txt");
    for (int i = 0; i < 300; ++i) {
      corpus << "sphinx of black quartz " << i % 7 << ", judge my vow number " << i % 17 << ".\n";
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  TrainConfig config(int world, const Layout& layout, const fs::path& run,
                     const std::string& resume = "") const {
    std::vector<std::string> all = {"data.seq_len=24",
                                    "train.micro_batch=" + std::to_string(kGlobalBatch / world),
                                    "train.steps=6"};
    if (world > 1) all.insert(all.end(), layout.keys.begin(), layout.keys.end());
    if (!resume.empty()) all.push_back("run.resume=\"" + resume + "\"");
    return testing::tiny_run_config(dir_ / "corpus.txt", run, all);
  }

  // Rank 0's losses of `steps` steps; with `save`, a checkpoint after them, whose directory is
  // returned through `saved`.
  std::vector<double> train(int world, const TrainConfig& cfg, int steps, bool save = false,
                            std::string* saved = nullptr) {
    std::vector<double> losses;
    run_local_ranks(world, [&](ProcessGroup& group) {
      auto shared = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
      Trainer trainer(cfg, shared);
      std::vector<double> mine;
      for (int i = 0; i < steps; ++i) mine.push_back(trainer.train_step().loss);
      std::string dir;
      if (save) dir = trainer.save_checkpoint();
      if (group.rank() == 0) {
        losses = mine;
        if (saved) *saved = dir;
      }
    });
    return losses;
  }

  fs::path dir_;
};

TEST_F(ReshardResumeTest, EveryStrategyResumesUnderAnotherAtTwoAndThreeRanks) {
  std::vector<double> want;
  {
    Trainer single(config(1, ddp(), dir_ / "single"));
    for (int i = 0; i < 6; ++i) want.push_back(single.train_step().loss);
  }
  const std::vector<std::tuple<Layout, Layout, Layout>> cases = {
      {ddp(), zero(3), fsdp()},
      {fsdp(), ddp(), zero(2)},
      {zero(2), fsdp(), zero(3)},
      {zero(3), zero(1), ddp()}};
  for (const auto& [saved_by, at_two, at_three] : cases) {
    SCOPED_TRACE("saved by " + saved_by.name + " on 4 ranks");
    std::string checkpoint;
    const auto first = train(4, config(4, saved_by, dir_ / saved_by.name), 3, true, &checkpoint);
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(first[i], want[i], 1e-5 * want[i]);
    for (const auto& [world, layout] :
         std::vector<std::pair<int, Layout>>{{2, at_two}, {3, at_three}}) {
      SCOPED_TRACE("resumed by " + layout.name + " on " + std::to_string(world) + " ranks");
      const fs::path run = dir_ / (saved_by.name + "_to_" + layout.name);
      const auto rest = train(world, config(world, layout, run, checkpoint), 3);
      ASSERT_EQ(rest.size(), 3u);
      for (size_t i = 0; i < 3; ++i) {
        EXPECT_NEAR(rest[i], want[i + 3], 1e-5 * want[i + 3]) << "step " << i + 4;
      }
    }
  }
}

}  // namespace reshard_resume_test
}  // namespace shardtrain
