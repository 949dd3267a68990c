// The trainer under parallel.strategy = "fsdp": in-process ranks, resume, and launched ranks.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "shardtrain/rendezvous.h"
#include "shardtrain/train.h"
#include "support.h"
#include "train/run_config.h"

namespace shardtrain {
namespace fsdp_trainer_test {

namespace fs = std::filesystem;

class FsdpTrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::fresh_test_dir("shardtrain_fsdp_trainer");
    std::ofstream corpus(dir_ / "corpus.txt");
    for (int i = 0; i < 200; ++i) {
      corpus << "pack my box with " << i % 9 << " dozen liquor jugs, said number " << i % 13
             << ".\n";
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  TrainConfig config(const std::vector<std::string>& overrides = {}) const {
    std::vector<std::string> all = {"train.micro_batch=8", "train.steps=4"};
    all.insert(all.end(), overrides.begin(), overrides.end());
    return testing::tiny_run_config(dir_ / "corpus.txt", dir_ / "run", all);
  }

  // Rank 0's losses of `steps` steps on `world` in-process ranks.
  std::vector<double> fsdp_losses(int world, const std::vector<std::string>& overrides, int steps) {
    std::vector<double> got;
    run_local_ranks(
        world,
        [&](ProcessGroup& group) {
          auto shared = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
          Trainer trainer(config(overrides), shared);
          std::vector<double> mine;
          for (int i = 0; i < steps; ++i) mine.push_back(trainer.train_step().loss);
          if (group.rank() == 0) got = mine;
        },
        ProcessGroupOptions().timeout(std::chrono::seconds(120)));
    return got;
  }

  fs::path dir_;
};

// train.chunked_loss (the default): the head's loss over chunks of tokens trains as the whole
// logits do, on one process and under each data-parallel strategy (the sharded ones gather the
// head inside the chunked loss's forward).
TEST_F(FsdpTrainerTest, TheChunkedLossTrainsAsTheWholeLogits) {
  Trainer single(config({"train.chunked_loss=false"}));
  std::vector<double> want;
  for (int i = 0; i < 4; ++i) want.push_back(single.train_step().loss);
  const std::vector<std::string> chunked = {"train.chunked_loss=true",
                                            "train.loss_chunk_tokens=24"};
  {
    auto overrides = chunked;
    overrides.push_back("run.dir=\"" + (dir_ / "chunked_none").string() + "\"");
    Trainer one(config(overrides));
    std::vector<double> got;
    for (int i = 0; i < 4; ++i) got.push_back(one.train_step().loss);
    testing::expect_same_losses(got, want, 1e-5);
  }
  for (const std::string layout : {"ddp", "fsdp", "zero"}) {
    SCOPED_TRACE(layout);
    auto overrides = chunked;
    overrides.insert(
        overrides.end(),
        {"parallel.strategy=\"" + layout + "\"", "parallel.zero.stage=3", "train.grad_accum=2",
         "train.micro_batch=2", "run.dir=\"" + (dir_ / ("chunked_" + layout)).string() + "\""});
    testing::expect_same_losses(fsdp_losses(2, overrides, 4), want, 1e-5);
  }
}

TEST_F(FsdpTrainerTest, EveryShardingOnFourRanksMatchesOneProcess) {
  Trainer single(config());
  std::vector<double> want;
  for (int i = 0; i < 4; ++i) want.push_back(single.train_step().loss);
  for (const std::string sharding : {"full_shard", "shard_grad_op", "no_shard", "hybrid_shard"}) {
    SCOPED_TRACE(sharding);
    testing::expect_same_losses(
        fsdp_losses(4,
                    {"parallel.strategy=\"fsdp\"", "train.micro_batch=2",
                     "parallel.fsdp.sharding=\"" + sharding + "\"", "parallel.fsdp.replicate=2",
                     "run.dir=\"" + (dir_ / sharding).string() + "\""},
                    4),
        want, 1e-5);
  }
  for (const std::string stage : {"1", "2", "3"}) {
    SCOPED_TRACE("zero stage " + stage);
    testing::expect_same_losses(
        fsdp_losses(
            4,
            {"parallel.strategy=\"zero\"", "train.micro_batch=2", "parallel.zero.stage=" + stage,
             "run.dir=\"" + (dir_ / ("zero" + stage)).string() + "\""},
            4),
        want, 1e-5);
  }
}

TEST_F(FsdpTrainerTest, ZeroStagesWithEachOffloadMatchOneProcessOverTenSteps) {
  Trainer single(config({"train.steps=10"}));
  std::vector<double> want;
  for (int i = 0; i < 10; ++i) want.push_back(single.train_step().loss);
  const fs::path nvme = dir_ / "nvme";
  fs::create_directories(nvme);
  for (const std::string stage : {"1", "2", "3"}) {
    for (const std::string offload : {"none", "cpu", "nvme"}) {
      SCOPED_TRACE("zero stage " + stage + " offload " + offload);
      std::vector<std::string> overrides = {
          "parallel.strategy=\"zero\"",
          "train.micro_batch=2",
          "train.steps=10",
          "parallel.zero.stage=" + stage,
          "parallel.zero.offload_optimizer=\"" + offload + "\"",
          "parallel.zero.nvme_path=\"" + nvme.string() + "\"",
          "run.dir=\"" + (dir_ / ("zero" + stage + offload)).string() + "\""};
      if (stage == "3" && offload != "none") {
        overrides.push_back("parallel.zero.offload_param=\"" + offload + "\"");
      }
      testing::expect_same_losses(fsdp_losses(4, overrides, 10), want, 1e-5);
    }
  }
  // Parameter shards in files with the optimizer state in memory: the whole-model optimizer
  // step reads every shard in first.
  testing::expect_same_losses(
      fsdp_losses(4,
                  {"parallel.strategy=\"zero\"", "train.micro_batch=2", "train.steps=10",
                   "parallel.zero.stage=3", "parallel.zero.offload_param=\"nvme\"",
                   "parallel.zero.nvme_path=\"" + nvme.string() + "\"",
                   "run.dir=\"" + (dir_ / "zero3param").string() + "\""},
                  10),
      want, 1e-5);
  // The state files are gone with the trainers.
  EXPECT_TRUE(fs::is_empty(nvme));
}

TEST_F(FsdpTrainerTest, ResumeOnTheSameRanksContinuesExactly) {
  const fs::path nvme = dir_ / "nvme";
  fs::create_directories(nvme);
  int variants = 0;
  for (const std::vector<std::string>& sharded :
       {std::vector<std::string>{"parallel.strategy=\"fsdp\""},
        std::vector<std::string>{"parallel.strategy=\"zero\"", "parallel.zero.stage=2",
                                 "parallel.zero.offload_optimizer=\"nvme\"",
                                 "parallel.zero.nvme_path=\"" + nvme.string() + "\""},
        std::vector<std::string>{"parallel.strategy=\"zero\"", "parallel.zero.stage=3",
                                 "parallel.zero.offload_optimizer=\"nvme\"",
                                 "parallel.zero.offload_param=\"nvme\"",
                                 "parallel.zero.nvme_path=\"" + nvme.string() + "\""}}) {
    SCOPED_TRACE(sharded.front() + " " + sharded.back());
    const std::string variant = std::to_string(++variants);
    std::vector<std::string> common = sharded;
    common.insert(common.end(), {"train.micro_batch=4", "train.steps=6"});
    auto with = [&](const std::string& dir) {
      auto all = common;
      all.push_back("run.dir=\"" + (dir_ / dir).string() + "\"");
      return all;
    };
    const auto straight = fsdp_losses(2, with("straight" + variant), 6);
    std::vector<double> resumed;
    run_local_ranks(2, [&](ProcessGroup& group) {
      auto shared = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
      auto overrides = with("resumed" + variant);
      {
        Trainer first(config(overrides), shared);
        for (int i = 0; i < 3; ++i) first.train_step();
        first.save_checkpoint();
      }
      overrides.push_back("run.resume=\"latest\"");
      Trainer second(config(overrides), shared);
      EXPECT_EQ(second.step(), 3);
      std::vector<double> mine;
      for (int i = 0; i < 3; ++i) mine.push_back(second.train_step().loss);
      if (group.rank() == 0) resumed = mine;
    });
    ASSERT_EQ(resumed.size(), 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(resumed[i], straight[i + 3]) << "step " << i + 4;
  }
}

TEST_F(FsdpTrainerTest, LaunchedFourRanksWriteTheLossesOfTheOneProcessRun) {
  const std::string config_file = (dir_ / "run.toml").string();
  std::ofstream(config_file) << "[model]\npreset = \"tiny\"\n[data]\ncorpus = \""
                             << (dir_ / "corpus.txt").string() << "\"\nseq_len = 32\n[train]\n"
                             << "steps = 3\nsample_tokens = 0\n[run]\nthreads = 1\n";
  const std::string train = testing::cli() + " train --config " + config_file;
  auto one =
      testing::run_command(testing::cli() + " launch --nproc 1 -- " + train +
                           " --set train.micro_batch=8 --set run.dir=" + (dir_ / "one").string());
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const auto want = testing::rank0_losses(dir_ / "one" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 3u);
  for (const std::string stage : {"1", "2", "3"}) {
    SCOPED_TRACE("zero stage " + stage);
    const fs::path run_dir = dir_ / ("zero" + stage);
    auto four = testing::run_command(
        testing::cli() + " launch --nproc 4 -- " + train +
        " --set train.micro_batch=2 --set parallel.strategy=zero --set parallel.zero.stage=" +
        stage + " --set run.dir=" + run_dir.string());
    ASSERT_EQ(four.exit_code, 0) << four.output;
    EXPECT_NE(four.output.find("zero stage " + stage + " over 4 rank(s)"), std::string::npos)
        << four.output;
    testing::expect_same_losses(testing::rank0_losses(run_dir / "metrics.jsonl"), want, 1e-5);
  }
  for (const std::string sharding : {"full_shard", "shard_grad_op", "no_shard", "hybrid_shard"}) {
    SCOPED_TRACE(sharding);
    const fs::path run_dir = dir_ / sharding;
    auto four = testing::run_command(
        testing::cli() + " launch --nproc 4 -- " + train +
        " --set train.micro_batch=2 --set parallel.strategy=fsdp --set parallel.fsdp.sharding=" +
        sharding + " --set parallel.fsdp.replicate=2 --set run.dir=" + run_dir.string());
    ASSERT_EQ(four.exit_code, 0) << four.output;
    EXPECT_NE(four.output.find("fsdp " + sharding + " over 4 rank(s)"), std::string::npos)
        << four.output;
    testing::expect_same_losses(testing::rank0_losses(run_dir / "metrics.jsonl"), want, 1e-5);
    // Every rank reports its shard bytes and the gathered peak.
    std::ifstream in(run_dir / "metrics.jsonl");
    std::string line;
    std::getline(in, line);
    const auto mem = nlohmann::json::parse(line).at("mem");
    EXPECT_GT(mem.at("params").get<int64_t>(), 0);
    // no_shard in fp32 computes on its master copy directly: nothing is ever gathered.
    EXPECT_EQ(mem.at("gathered_peak").get<int64_t>() > 0, sharding != "no_shard");
  }
}

TEST_F(FsdpTrainerTest, BadFsdpSettingsAreNamed) {
  auto message = [&](const std::vector<std::string>& overrides) {
    try {
      Trainer trainer(config(overrides));
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(
      message({"parallel.strategy=\"fsdp\"", "parallel.fsdp.sharding=\"zero4\""}).find("zero4"),
      std::string::npos);
  EXPECT_NE(message({"parallel.strategy=\"fsdp\"", "parallel.fsdp.wrap=\"class\"",
                     "parallel.fsdp.wrap_classes=[\"BertLayer\"]"})
                .find("BertLayer"),
            std::string::npos);
  EXPECT_NE(message({"parallel.strategy=\"fsdp\"", "parallel.fsdp.sharding=\"hybrid_shard\""})
                .find("parallel.fsdp.replicate"),
            std::string::npos);
  EXPECT_NE(message({"precision.param_dtype=\"bf16\""}).find("parallel.strategy"),
            std::string::npos);
}

}  // namespace fsdp_trainer_test
}  // namespace shardtrain
