// The run directory's contract: a new run never mixes with an old one, a failed start-up
// changes nothing, "auto" resumes when it can, a diverging run stops without replacing the
// last good checkpoint, and a launcher's restart continues from the checkpoint it left.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "shardtrain/sharded_checkpoint.h"
#include "shardtrain/train.h"
#include "support.h"
#include "train/run_config.h"

namespace shardtrain {
namespace run_dir_test {

namespace fs = std::filesystem;

std::string contents(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

class RunDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::fresh_test_dir("shardtrain_run_dir");
    run_ = dir_ / "run";
    std::ofstream corpus(dir_ / "corpus.txt");
    for (int i = 0; i < 200; ++i)
      corpus << "sphinx of black quartz " << i % 7 << ", judge my vow.\n";
  }
  void TearDown() override { fs::remove_all(dir_); }

  TrainConfig config(const std::vector<std::string>& overrides = {}) const {
    std::vector<std::string> all = {"train.micro_batch=4", "train.steps=2"};
    all.insert(all.end(), overrides.begin(), overrides.end());
    return testing::tiny_run_config(dir_ / "corpus.txt", run_, all);
  }

  // A TOML config for launched DDP runs of the tiny model with `train` settings added, written
  // to DIR/run.toml; returns its path.
  std::string launch_config(const std::string& train) const {
    const std::string path = (dir_ / "run.toml").string();
    std::ofstream(path) << "[model]\npreset = \"tiny\"\n[data]\ncorpus = \""
                        << (dir_ / "corpus.txt").string() << "\"\nseq_len = 32\n[train]\n"
                        << train << "micro_batch = 2\nsample_tokens = 0\n"
                        << "[parallel]\nstrategy = \"ddp\"\n[run]\nthreads = 1\n";
    return path;
  }

  static std::string refusal(const TrainConfig& config) {
    try {
      Trainer trainer(config);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    ADD_FAILURE() << "the trainer started";
    return "";
  }

  fs::path dir_;
  fs::path run_;  // the run.dir of config()
};

TEST_F(RunDirTest, ANewRunIntoAnOldOneIsRefusedAndOverwriteMovesTheOldOneAside) {
  Trainer(config()).fit();
  const std::string metrics = contents(run_ / "metrics.jsonl");
  const std::string latest = contents(run_ / "checkpoints" / "latest");
  ASSERT_FALSE(metrics.empty());

  const std::string message = refusal(config());
  EXPECT_NE(message.find(run_.string()), std::string::npos) << message;
  EXPECT_NE(message.find("run.resume"), std::string::npos) << message;
  EXPECT_NE(message.find("run.overwrite"), std::string::npos) << message;
  EXPECT_EQ(contents(run_ / "metrics.jsonl"), metrics);
  EXPECT_EQ(contents(run_ / "checkpoints" / "latest"), latest);

  EXPECT_NE(refusal(config({"run.overwrite=true", "run.resume=\"latest\""})).find("set one"),
            std::string::npos);

  Trainer(config({"run.overwrite=true", "train.steps=1"})).fit();
  EXPECT_EQ(contents(fs::path(run_.string() + ".old.1") / "metrics.jsonl"), metrics);
  EXPECT_EQ(testing::rank0_losses(run_ / "metrics.jsonl").size(), 1u);
}

TEST_F(RunDirTest, ALiveRunKeepsItsDirectory) {
  {
    Trainer first(config({"train.steps=4"}));
    first.train_step();
    first.save_checkpoint();
    const std::string latest = contents(run_ / "checkpoints" / "latest");
    // A second run into the same directory, resuming it, or starting over over it, is refused
    // while the first lives, naming it; nothing of the first's moves.
    const std::string me = "process " + std::to_string(::getpid()) + " on ";
    for (const auto& settings : std::vector<std::vector<std::string>>{
             {"run.resume=\"auto\""}, {"run.overwrite=true"}, {"run.resume=\"latest\""}}) {
      const std::string message = refusal(config(settings));
      EXPECT_NE(message.find("run.dir '" + run_.string() +
                             "' is in use by a run that is still going (" + me),
                std::string::npos)
          << message;
      EXPECT_EQ(contents(run_ / "checkpoints" / "latest"), latest);
      EXPECT_FALSE(fs::exists(run_.string() + ".old.1"));
    }
    first.train_step();  // the first run goes on
  }
  // Once it has ended the directory is free again.
  Trainer second(config({"run.resume=\"auto\""}));
  EXPECT_EQ(second.step(), 1);
}

TEST_F(RunDirTest, AStartUpThatFailsChangesNothingInTheRunDirectory) {
  // A fresh directory is not even created when the corpus is missing.
  run_ = dir_ / "never";
  const std::string missing =
      refusal(config({"data.corpus=\"" + (dir_ / "nope.txt").string() + "\""}));
  EXPECT_NE(missing.find("nope.txt"), std::string::npos) << missing;
  EXPECT_FALSE(fs::exists(run_));

  // A fresh directory the start-up made is removed again when a later check refuses the run:
  // here the model file, read after the corpus was tokenized into the directory.
  const fs::path garbage = dir_ / "garbage.safetensors";
  { std::ofstream(garbage) << "not a safetensors file at all, only text"; }
  run_ = dir_ / "refused";
  const std::string bad_model = refusal(config({"model.init_from=\"" + garbage.string() + "\""}));
  EXPECT_NE(bad_model.find("garbage.safetensors"), std::string::npos) << bad_model;
  EXPECT_FALSE(fs::exists(run_));

  // An existing run keeps its run.json and metrics when a later start fails.
  run_ = dir_ / "run";
  Trainer(config()).fit();
  const std::string manifest = contents(run_ / "run.json");
  refusal(config({"run.overwrite=true", "data.corpus=\"" + (dir_ / "nope.txt").string() + "\""}));
  EXPECT_EQ(contents(run_ / "run.json"), manifest);
  EXPECT_FALSE(fs::exists(run_.string() + ".old.1"));
  refusal(
      config({"run.resume=\"latest\"", "model.init_from=\"" + (dir_ / "none").string() + "\""}));
  EXPECT_EQ(contents(run_ / "run.json"), manifest);

  // A resume with another tokenizer is refused naming both, before the corpus is tokenized
  // again into the run's token shard.
  const std::string shard = contents(run_ / "corpus.tokens");
  const std::string other = refusal(config({"run.resume=\"latest\"", "data.tokenizer=\"gpt2\""}));
  EXPECT_NE(other.find("run.resume"), std::string::npos) << other;
  EXPECT_NE(other.find("byte tokenizer"), std::string::npos) << other;
  EXPECT_NE(other.find("gpt2"), std::string::npos) << other;
  EXPECT_EQ(contents(run_ / "corpus.tokens"), shard);
  EXPECT_EQ(contents(run_ / "run.json"), manifest);

  // An empty `latest` is called empty (not missing) under "auto" as under "latest".
  std::ofstream(run_ / "checkpoints" / "latest").close();
  const std::string empty = refusal(config({"run.resume=\"auto\""}));
  EXPECT_NE(empty.find("latest' is empty"), std::string::npos) << empty;
  EXPECT_EQ(contents(run_ / "run.json"), manifest);
}

TEST_F(RunDirTest, ResumeAutoStartsFreshThenContinuesWithoutRepeatingAStep) {
  run_ = dir_ / "straight";
  Trainer(config({"train.steps=5"})).fit();
  const auto want = testing::rank0_losses(run_ / "metrics.jsonl");

  run_ = dir_ / "auto";
  // "latest" has nothing to resume; "auto" starts a new run.
  EXPECT_NE(refusal(config({"run.resume=\"latest\""})).find("\"auto\""), std::string::npos);
  {
    Trainer first(config({"run.resume=\"auto\"", "train.steps=5", "train.checkpoint_every=2"}));
    EXPECT_EQ(first.step(), 0);
    for (int i = 0; i < 3; ++i) first.train_step();  // as if killed after step 3
    first.save_checkpoint();
  }
  Trainer second(config({"run.resume=\"auto\"", "train.steps=5"}));
  EXPECT_EQ(second.step(), 3);
  second.fit();
  const auto got = testing::rank0_losses(run_ / "metrics.jsonl");
  ASSERT_EQ(got.size(), 2u);  // steps 4 and 5: fit() writes metrics, train_step() alone does not
  EXPECT_EQ(got[0], want[3]);
  EXPECT_EQ(got[1], want[4]);
}

TEST_F(RunDirTest, NonFiniteSettingsAreRefused) {
  for (const std::string setting :
       {"train.lr=inf", "train.lr=nan", "train.min_lr=-inf", "train.clip=inf", "train.eps=nan"}) {
    SCOPED_TRACE(setting);
    try {
      config({setting});
      ADD_FAILURE() << "accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("finite"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(setting.substr(0, setting.find('='))), std::string::npos)
          << e.what();
    }
  }
}

TEST_F(RunDirTest, ADivergingRunStopsAndKeepsTheLastGoodCheckpoint) {
  Trainer trainer(config({"train.steps=10", "train.checkpoint_every=2", "train.max_skipped=3"}));
  // From step 3 on every gradient is NaN, as after a diverging update.
  trainer.set_after_backward([&](int64_t step) {
    if (step >= 2) trainer.model()->parameters()[0].mutable_grad().fill_(NAN);
  });
  try {
    trainer.fit();
    FAIL() << "the run went on";
  } catch (const std::runtime_error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("steps 3 to 5"), std::string::npos) << message;
    EXPECT_NE(message.find("train.max_skipped = 3"), std::string::npos) << message;
    EXPECT_NE(message.find("at step 2"), std::string::npos) << message;
  }
  EXPECT_EQ(trainer.step(), 5);
  EXPECT_EQ(contents(run_ / "checkpoints" / "latest"), "step_000002\n");
  EXPECT_FALSE(fs::exists(run_ / "checkpoints" / "step_000004"));
  // Skipped steps log no gradient norm rather than a made-up 0.
  std::ifstream in(run_ / "metrics.jsonl");
  std::string line;
  for (int i = 0; i < 3; ++i) std::getline(in, line);
  EXPECT_TRUE(nlohmann::json::parse(line).at("grad_norm").is_null()) << line;
}

TEST_F(RunDirTest, ARunThatEndsOnSkippedStepsFails) {
  // Steps 2 to 5 have non-finite gradients: fewer than max_skipped, but the last ones.
  Trainer trainer(config({"train.steps=5", "train.checkpoint_every=1", "train.max_skipped=10"}));
  trainer.set_after_backward([&](int64_t step) {
    if (step >= 1) trainer.model()->parameters()[0].mutable_grad().fill_(NAN);
  });
  try {
    trainer.fit();
    FAIL() << "a run that ended on skipped steps succeeded";
  } catch (const std::runtime_error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("ended on 4 step(s) with non-finite gradients (steps 2 to 5)"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("at step 1"), std::string::npos) << message;
  }
  EXPECT_EQ(trainer.step(), 5);
  EXPECT_EQ(contents(run_ / "checkpoints" / "latest"), "step_000001\n");
  EXPECT_FALSE(fs::exists(run_ / "checkpoints" / "step_000005"));
}

TEST_F(RunDirTest, AResumeWithAnotherBatchShapeSaysSo) {
  Trainer(config({"train.checkpoint_every=1"})).fit();
  ::testing::internal::CaptureStdout();
  { Trainer same(config({"train.steps=3", "run.resume=latest"})); }
  const std::string unchanged = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(unchanged.find("resumed from"), std::string::npos) << unchanged;
  EXPECT_EQ(unchanged.find("note: the checkpoint"), std::string::npos) << unchanged;
  ::testing::internal::CaptureStdout();
  { Trainer smaller(config({"train.steps=3", "run.resume=latest", "train.micro_batch=2"})); }
  const std::string changed = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(changed.find("note: the checkpoint was trained on global batches of 4 sequences of"),
            std::string::npos)
      << changed;
  EXPECT_NE(changed.find("this run takes 2 of"), std::string::npos) << changed;
}

// Reads every tensor of a checkpoint.
std::map<std::string, at::Tensor> tensors_of(const fs::path& dir) {
  const ShardedCheckpointReader reader(dir.string());
  std::map<std::string, at::Tensor> out;
  for (const auto& spec : reader.tensors()) out[spec.name] = reader.read(spec.name);
  return out;
}

TEST_F(RunDirTest, LaunchRestartsAKilledRankFromItsLatestCheckpoint) {
  const std::string config_file = launch_config("steps = 6\ncheckpoint_every = 2\n");
  auto train = [&](const std::string& run, const std::string& env) {
    return testing::run_command(env + " " + testing::cli() +
                                " launch --nproc 2 --max-restarts 1 --kill-timeout 2 -- " +
                                testing::cli() + " train --config " + config_file +
                                " --set run.dir=" + (dir_ / run).string());
  };
  const auto straight = train("straight", "");
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  // Rank 1 dies by SIGKILL after step 3 (after the step-2 checkpoint); the restart resumes.
  const auto restarted = train("restarted", "SHARDTRAIN_KILL_AFTER_STEP=3");
  ASSERT_EQ(restarted.exit_code, 0) << restarted.output;
  EXPECT_NE(restarted.output.find("restarting (1 of 1)"), std::string::npos) << restarted.output;
  EXPECT_NE(restarted.output.find("resumed from"), std::string::npos) << restarted.output;

  // Each step and rank once in metrics.jsonl, with the uninterrupted run's losses.
  std::map<std::pair<int64_t, int>, int> seen;
  std::ifstream in(dir_ / "restarted" / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    ++seen[{j.at("step").get<int64_t>(), j.at("rank").get<int>()}];
  }
  EXPECT_EQ(seen.size(), 12u);
  for (const auto& [key, count] : seen) EXPECT_EQ(count, 1) << "step " << key.first;
  EXPECT_EQ(testing::rank0_losses(dir_ / "restarted" / "metrics.jsonl"),
            testing::rank0_losses(dir_ / "straight" / "metrics.jsonl"));
  // The final parameters and optimizer state are bit for bit the uninterrupted run's.
  const auto want = tensors_of(dir_ / "straight" / "checkpoints" / "step_000006");
  const auto got = tensors_of(dir_ / "restarted" / "checkpoints" / "step_000006");
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, tensor] : want) {
    EXPECT_TRUE(at::equal(got.at(name), tensor)) << name;
  }
}

TEST_F(RunDirTest, AStoppedPeerEndsTheRunWithinItsTimeout) {
  const std::string config_file = launch_config("steps = 500\n");
  // Rank 1 stops (SIGSTOP) after step 2: its socket stays open, so only the timeout finds it.
  const auto start = std::chrono::steady_clock::now();
  const auto result = testing::run_command("SHARDTRAIN_STOP_AFTER_STEP=2 " + testing::cli() +
                                           " launch --nproc 2 --timeout 10 -- " + testing::cli() +
                                           " train --config " + config_file +
                                           " --set run.dir=" + (dir_ / "run").string());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("Timed out waiting 10000ms"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("waiting for data from global rank 1 at 127.0.0.1"),
            std::string::npos)
      << result.output;
  // 10 s of timeout, plus start-up and the stop of the other rank, but not the default 30 min,
  // nor the launcher's 10 s of grace for SIGTERM, which a stopped rank would hold.
  EXPECT_GE(seconds, 10.0);
  EXPECT_LT(seconds, 10.0 + 5.0 + 5.0) << "start-up included";
}

}  // namespace run_dir_test
}  // namespace shardtrain
