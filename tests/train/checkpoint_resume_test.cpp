// Trainer checkpoints in the sharded format: resuming at another world size, refusing another
// model, and surviving a process killed in the middle of a save.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "shardtrain/rendezvous.h"
#include "shardtrain/sharded_checkpoint.h"
#include "shardtrain/train.h"
#include "support.h"
#include "train/run_config.h"

namespace shardtrain {
namespace checkpoint_resume_test {

namespace fs = std::filesystem;

class CheckpointResumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::fresh_test_dir("shardtrain_resume");
    std::ofstream corpus(dir_ / "corpus.txt");
    for (int i = 0; i < 200; ++i) {
      corpus << "a stitch in time " << i % 5 << " saves nine, said number " << i % 13 << ".\n";
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A global batch of 6 sequences on `world` ranks.
  TrainConfig config(int world, const std::string& run, std::vector<std::string> extra = {}) const {
    std::vector<std::string> all = {
        "train.micro_batch=" + std::to_string(6 / world), "train.steps=6",
        std::string("parallel.strategy=") + (world > 1 ? "\"ddp\"" : "\"none\"")};
    all.insert(all.end(), extra.begin(), extra.end());
    return testing::tiny_run_config(dir_ / "corpus.txt", dir_ / run, all);
  }

  // Losses of `steps` steps on `world` in-process ranks (rank 0's); `after` runs on every rank.
  std::vector<double> run(int world, const TrainConfig& cfg, int steps,
                          const std::function<void(Trainer&)>& after = nullptr) {
    std::vector<double> losses;
    auto body = [&](std::shared_ptr<ProcessGroup> group) {
      Trainer trainer(cfg, group);
      std::vector<double> mine;
      for (int i = 0; i < steps; ++i) mine.push_back(trainer.train_step().loss);
      if (after) after(trainer);
      if (trainer.rank() == 0) losses = mine;
    };
    if (world == 1) {
      body(nullptr);
    } else {
      run_local_ranks(
          world,
          [&](ProcessGroup& group) {
            body(std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {}));
          },
          ProcessGroupOptions().timeout(std::chrono::seconds(120)));
    }
    return losses;
  }

  fs::path dir_;
};

TEST_F(CheckpointResumeTest, DdpCheckpointOfTwoRanksResumesOnOneTwoAndThree) {
  const auto uninterrupted = run(2, config(2, "full"), 6);
  std::string saved;
  const auto head = run(2, config(2, "half"), 3, [&](Trainer& t) {
    const std::string dir = t.save_checkpoint();
    if (t.rank() == 0) saved = dir;
  });
  for (int i = 0; i < 3; ++i) EXPECT_EQ(head[i], uninterrupted[i]) << "step " << i + 1;
  const ShardedCheckpointReader reader(saved);
  EXPECT_EQ(reader.world_size(), 2);
  EXPECT_EQ(reader.strategy(), "ddp");
  ASSERT_EQ(reader.files().size(), 2u);
  EXPECT_GT(reader.files()[1].slices, 0);  // both ranks wrote
  ASSERT_NE(reader.find("optim.blocks.0.attn.qkv.weight.exp_avg_sq"), nullptr);
  EXPECT_EQ(reader.read("optim.tok_emb.weight.step").item<int64_t>(), 3);

  for (int world : {2, 1, 3}) {
    SCOPED_TRACE("resumed on " + std::to_string(world) + " ranks");
    TrainConfig resumed = config(world, "resume" + std::to_string(world));
    resumed.run.resume = saved;
    const auto tail = run(world, resumed, 3);
    ASSERT_EQ(tail.size(), 3u);
    for (int i = 0; i < 3; ++i) {
      if (world == 2) {
        EXPECT_EQ(tail[i], uninterrupted[i + 3]) << "step " << i + 4;  // same layout: bit-exact
      } else {
        EXPECT_NEAR(tail[i], uninterrupted[i + 3], 1e-5 * uninterrupted[i + 3]) << "step " << i + 4;
      }
    }
  }
}

TEST_F(CheckpointResumeTest, AGlobalBatchIsKeptOnOtherWorldSizesByTheAccumulation) {
  // 8 sequences per step: 2 ranks x micro-batch 2 x 2 accumulated; on 1 rank 4, on 4 ranks 1.
  const std::vector<std::string> batch = {"train.micro_batch=2", "train.global_batch=8"};
  const auto uninterrupted = run(2, config(2, "full", batch), 6);
  std::string saved;
  run(2, config(2, "half", batch), 3, [&](Trainer& t) {
    EXPECT_EQ(t.config().train.grad_accum, 2);
    const std::string dir = t.save_checkpoint();
    if (t.rank() == 0) saved = dir;
  });
  for (int world : {1, 4}) {
    SCOPED_TRACE("resumed on " + std::to_string(world) + " ranks");
    TrainConfig resumed = config(world, "resume" + std::to_string(world), batch);
    resumed.run.resume = saved;
    const auto tail = run(world, resumed, 3, [&](Trainer& t) {
      EXPECT_EQ(t.config().train.grad_accum, 8 / (2 * world));
      EXPECT_EQ(t.data().global_batch_size(), 8);
    });
    ASSERT_EQ(tail.size(), 3u);
    for (int i = 0; i < 3; ++i) {
      EXPECT_NEAR(tail[i], uninterrupted[i + 3], 1e-5 * uninterrupted[i + 3]) << "step " << i + 4;
    }
  }

  // A world on which the global batch cannot be kept, and an accumulation that disagrees.
  auto refusal = [&](int world, std::vector<std::string> settings) {
    try {
      run(world, config(world, "refused", settings), 1);
    } catch (const std::exception& e) {  // in-process ranks pass the first rank's error on
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  const std::string three = refusal(3, batch);
  EXPECT_NE(three.find("train.global_batch = 8 cannot be kept on 3 data-parallel ranks"),
            std::string::npos)
      << three;
  EXPECT_NE(three.find("multiple of micro_batch x data-parallel ranks = 6 (the nearest: 6 or 12)"),
            std::string::npos)
      << three;
  const std::string accumulation =
      refusal(1, {"train.micro_batch=2", "train.global_batch=8", "train.grad_accum=2"});
  EXPECT_NE(accumulation.find("train.grad_accum = 2"), std::string::npos) << accumulation;
  EXPECT_NE(accumulation.find("needs 4 micro-batches"), std::string::npos) << accumulation;
  EXPECT_FALSE(fs::exists(dir_ / "refused"));
}

TEST_F(CheckpointResumeTest, ACheckpointOfAnotherModelIsRefusedNamingTheFirstTensor) {
  std::string saved;
  run(1, config(1, "a"), 1, [&](Trainer& t) { saved = t.save_checkpoint(); });
  auto refusal = [&](const std::string& override_text) {
    TrainConfig other = config(1, "b", {override_text});
    other.run.resume = saved;
    try {
      Trainer trainer(other);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  const std::string wider_mlp = refusal("model.ffn_hidden=128");
  EXPECT_NE(wider_mlp.find("tensor 'blocks.0.mlp.fc.weight'"), std::string::npos) << wider_mlp;
  EXPECT_NE(wider_mlp.find("[256, 64]"), std::string::npos) << wider_mlp;
  const std::string shallower = refusal("model.n_layers=1");
  EXPECT_NE(shallower.find("'blocks.1.ln1.weight'"), std::string::npos) << shallower;
  const std::string deeper = refusal("model.n_layers=3");
  EXPECT_NE(deeper.find("no tensor 'blocks.2.ln1.weight'"), std::string::npos) << deeper;
}

TEST_F(CheckpointResumeTest, ADamagedCheckpointIsRefusedOnResumeNamingTheFile) {
  std::string saved;
  run(1, config(1, "a"), 2, [&](Trainer& t) { saved = t.save_checkpoint(); });
  const std::string file = (fs::path(saved) / "rank_00000.safetensors").string();
  fs::resize_file(file, fs::file_size(file) - 1);
  TrainConfig resumed = config(1, "b");
  resumed.run.resume = saved;
  try {
    Trainer trainer(resumed);
    FAIL() << "a truncated checkpoint was loaded";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
  }
}

// Losses by step from rank 0's lines of a metrics file.
std::map<int, double> metric_losses(const fs::path& file) {
  std::map<int, double> out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.at("rank").get<int>() == 0) out[j.at("step").get<int>()] = j.at("loss").get<double>();
  }
  return out;
}

// Synchronous and asynchronous saves (run.checkpoint_async, where the save of step 4 dies on its
// writing thread while the training thread goes on with step 5).
TEST_F(CheckpointResumeTest, AProcessKilledMidSaveLeavesThePreviousCheckpointLoadable) {
  const std::string config_file = (dir_ / "run.toml").string();
  std::ofstream(config_file) << "[model]\npreset = \"tiny\"\n[data]\ncorpus = \""
                             << (dir_ / "corpus.txt").string() << "\"\nseq_len = 32\n[train]\n"
                             << "steps = 6\nmicro_batch = 2\ncheckpoint_every = 2\n"
                             << "sample_tokens = 0\n[run]\nthreads = 1\n";
  const std::string train = testing::cli() + " train --config " + config_file;
  auto clean = testing::run_command(train + " --set run.dir=" + (dir_ / "clean").string());
  ASSERT_EQ(clean.exit_code, 0) << clean.output;
  const auto want = metric_losses(dir_ / "clean" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 6u);
  for (const std::string async : {"false", "true"}) {
    SCOPED_TRACE("run.checkpoint_async = " + async);
    const fs::path run = dir_ / ("killed_" + async);
    const std::string settings =
        " --set run.dir=" + run.string() + " --set run.checkpoint_async=" + async;
    auto killed =
        testing::run_command("SHARDTRAIN_FAULT_KILL_BEFORE_COMMIT=step_000004 " + train + settings);
    EXPECT_EQ(killed.exit_code, 128 + 9) << killed.output;
    const fs::path root = run / "checkpoints";
    // The killed save wrote its rank file into the staging directory, and nothing else.
    EXPECT_TRUE(fs::exists(root / ".step_000004.partial" / "rank_00000.safetensors"));
    EXPECT_FALSE(fs::exists(root / ".step_000004.partial" / "index.json"));
    EXPECT_FALSE(fs::exists(root / "step_000004"));
    EXPECT_EQ(resolve_checkpoint(root.string(), "latest"), (root / "step_000002").string());
    ShardedCheckpointReader(resolve_checkpoint(root.string(), "latest")).verify();

    auto resumed = testing::run_command(train + settings + " --set run.resume=latest");
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("at step 2"), std::string::npos) << resumed.output;
    // The run's last save is on disk when the command returns, asynchronous or not.
    EXPECT_EQ(resolve_checkpoint(root.string(), "latest"), (root / "step_000006").string());
    ShardedCheckpointReader(resolve_checkpoint(root.string(), "latest")).verify();
    EXPECT_EQ(metric_losses(run / "metrics.jsonl"), want);
  }
}

}  // namespace checkpoint_resume_test
}  // namespace shardtrain
