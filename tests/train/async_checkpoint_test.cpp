// run.checkpoint_async: saves written behind training are the synchronous saves' files bit for
// bit, leave the training's losses unchanged, and report their errors. (A process killed while
// one is written: CheckpointResumeTest.AProcessKilledMidSaveLeavesThePreviousCheckpointLoadable.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>

#include "shardtrain/rendezvous.h"
#include "shardtrain/sharded_checkpoint.h"
#include "shardtrain/train.h"
#include "support.h"
#include "train/run_config.h"

namespace shardtrain {
namespace async_checkpoint_test {

namespace fs = std::filesystem;

std::string contents_of(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Every file under `root` (relative name to bytes).
std::map<std::string, std::string> files_under(const fs::path& root) {
  std::map<std::string, std::string> out;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    if (entry.is_regular_file()) {
      out[fs::relative(entry.path(), root).string()] = contents_of(entry.path());
    }
  }
  return out;
}

// (step, rank) to loss, from every line of a metrics file.
std::map<std::pair<int, int>, double> metric_losses(const fs::path& file) {
  std::map<std::pair<int, int>, double> out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    out[{j.at("step").get<int>(), j.at("rank").get<int>()}] = j.at("loss").get<double>();
  }
  return out;
}

class AsyncCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::fresh_test_dir("shardtrain_async_ckpt");
    std::ofstream corpus(dir_ / "corpus.txt");
    for (int i = 0; i < 200; ++i) {
      corpus << "many hands make light work " << i % 7 << ", said number " << i % 11 << ".\n";
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  TrainConfig config(const std::string& run, std::vector<std::string> extra) const {
    std::vector<std::string> all = {"train.steps=6", "train.checkpoint_every=2",
                                    "train.keep_checkpoints=3", "run.threads=1"};
    all.insert(all.end(), extra.begin(), extra.end());
    return testing::tiny_run_config(dir_ / "corpus.txt", dir_ / run, all);
  }

  // fit() on `world` in-process ranks.
  static void fit(int world, const TrainConfig& cfg) {
    if (world == 1) {
      Trainer(cfg).fit();
      return;
    }
    run_local_ranks(
        world,
        [&](ProcessGroup& group) {
          Trainer(cfg, std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {})).fit();
        },
        ProcessGroupOptions().timeout(std::chrono::seconds(120)));
  }

  fs::path dir_;
};

TEST_F(AsyncCheckpointTest, SavesWrittenBehindTrainingAreTheSynchronousSavesBitForBit) {
  const struct {
    int world;
    std::vector<std::string> settings;
  } cases[] = {
      {1, {"parallel.strategy=\"none\"", "train.micro_batch=4"}},
      {2, {"parallel.strategy=\"ddp\"", "train.micro_batch=2"}},
      {2, {"parallel.strategy=\"fsdp\"", "train.micro_batch=2"}},
      {2, {"parallel.strategy=\"zero\"", "parallel.zero.stage=3", "train.micro_batch=2"}},
  };
  int n = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.settings[0] + " on " + std::to_string(c.world) + " rank(s)");
    const std::string name = "case" + std::to_string(n++);
    fit(c.world, config(name + "_sync", c.settings));
    auto async_settings = c.settings;
    async_settings.push_back("run.checkpoint_async=true");
    fit(c.world, config(name + "_async", async_settings));

    const auto sync_losses = metric_losses(dir_ / (name + "_sync") / "metrics.jsonl");
    const auto async_losses = metric_losses(dir_ / (name + "_async") / "metrics.jsonl");
    EXPECT_EQ(sync_losses.size(), 6u * c.world);
    EXPECT_EQ(async_losses, sync_losses);

    const auto sync_files = files_under(dir_ / (name + "_sync") / "checkpoints");
    const auto async_files = files_under(dir_ / (name + "_async") / "checkpoints");
    // Steps 2, 4 and 6: an index and a file per rank each, and `latest`.
    EXPECT_EQ(sync_files.size(), 3u * (1 + c.world) + 1);
    ASSERT_EQ(async_files.size(), sync_files.size());
    for (const auto& [file, bytes] : sync_files) {
      ASSERT_TRUE(async_files.count(file)) << file;
      EXPECT_TRUE(async_files.at(file) == bytes) << file << " differs";
    }
    EXPECT_EQ(async_files.at("latest"), "step_000006\n");
  }
}

// The host buffers the copies are made into: prepared ahead, used by a save, given back when it
// ends and used again by the next (the same memory), and never shared between two checkpoints'
// values.
TEST_F(AsyncCheckpointTest, StagingBuffersAreKeptFromOneSaveToTheNext) {
  const std::vector<TensorSpec> specs = {{"w", {4, 8}, at::kFloat}, {"b", {8}, at::kLong}};
  at::Tensor w = at::arange(32, at::kFloat);
  const at::Tensor b = at::arange(8, at::kLong);
  const std::vector<FlatSlice> slices = {{"w", 0, w}, {"b", 0, b}};
  const std::string root = (dir_ / "lib").string();
  auto staging = std::make_shared<CheckpointStaging>();

  staging->prepare(slices);
  const at::Tensor prepared = staging->take(0, w);  // waits for the preparation
  EXPECT_EQ(prepared.scalar_type(), at::kFloat);
  EXPECT_EQ(prepared.numel(), 32);
  EXPECT_EQ(staging->bytes(), 8 * 8);  // the other buffer, still kept
  const void* memory = prepared.data_ptr();
  staging->keep({{"w", 0, prepared}, {"b", 0, staging->take(1, b)}});
  EXPECT_EQ(staging->bytes(), 32 * 4 + 8 * 8);

  auto save = [&](const std::string& name) {
    return save_sharded_checkpoint_async(root, name, specs, slices, nullptr,
                                         ShardedSaveOptions().staging(staging))
        .get();
  };
  const std::string first = save("one");
  EXPECT_EQ(staging->bytes(), 32 * 4 + 8 * 8);  // given back
  w.add_(100);                                  // the next save's values
  const std::string second = save("two");
  EXPECT_TRUE(at::equal(ShardedCheckpointReader(first).read("w").reshape({-1}),
                        at::arange(32, at::kFloat)));
  EXPECT_TRUE(at::equal(ShardedCheckpointReader(second).read("w").reshape({-1}), w));
  EXPECT_TRUE(at::equal(ShardedCheckpointReader(second).read("b"), b));
  // Both saves copied into the prepared memory.
  const at::Tensor again = staging->take(0, w);
  EXPECT_EQ(again.data_ptr(), memory);
  EXPECT_TRUE(at::equal(again, w));
  // A slice of another dtype or size gets memory of its own.
  const at::Tensor other = staging->take(1, at::zeros({5}, at::kDouble));
  EXPECT_EQ(other.scalar_type(), at::kDouble);
  EXPECT_EQ(other.numel(), 5);
}

TEST_F(AsyncCheckpointTest, AFailedSaveBehindTrainingFailsTheRunOnEveryRank) {
  // `latest` cannot be replaced by a file: the commit on rank 0's writing thread fails.
  const TrainConfig cfg = config("failing", {"parallel.strategy=\"ddp\"", "train.micro_batch=2",
                                             "train.steps=4", "run.checkpoint_async=true"});
  std::vector<std::string> errors(2);
  run_local_ranks(
      2,
      [&](ProcessGroup& group) {
        try {
          Trainer trainer(cfg, std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {}));
          // Before the first step's collectives, so before any rank's first save.
          if (group.rank() == 0) {
            fs::create_directories(dir_ / "failing" / "checkpoints" / "latest" / "in_the_way");
          }
          trainer.fit();
        } catch (const std::exception& e) {
          errors[group.rank()] = e.what();
        }
      },
      ProcessGroupOptions().timeout(std::chrono::seconds(120)));
  for (const auto& error : errors) EXPECT_NE(error.find("latest"), std::string::npos) << error;
  EXPECT_FALSE(fs::exists(dir_ / "failing" / "checkpoints" / "step_000004"));
}

TEST_F(AsyncCheckpointTest, StateKeptInFilesIsRefusedNamingBothKeys) {
  try {
    config("nvme", {"parallel.strategy=\"zero\"", "parallel.zero.stage=3",
                    "parallel.zero.offload_optimizer=\"nvme\"",
                    "parallel.zero.nvme_path=\"" + (dir_ / "swap").string() + "\"",
                    "run.checkpoint_async=true"})
        .validate();
    FAIL() << "accepted";
  } catch (const std::invalid_argument& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("run.checkpoint_async"), std::string::npos) << message;
    EXPECT_NE(message.find("nvme"), std::string::npos) << message;
  }
}

}  // namespace async_checkpoint_test
}  // namespace shardtrain
