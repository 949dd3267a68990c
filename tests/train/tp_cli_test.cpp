// Tensor parallelism through the command line: launched runs at tp = 2 x dp = 2 and at tp = 4
// write the losses of the one-process run, and the planner's tensor-parallel TOML trains.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "shardtrain/plan.h"
#include "support.h"

namespace shardtrain {
namespace tp_cli_test {

namespace fs = std::filesystem;

class TensorParallelCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::fresh_test_dir("shardtrain_tp_cli");
    std::ofstream corpus(dir_ / "corpus.txt");
    for (int i = 0; i < 300; ++i) {
      corpus << "the five boxing wizards jump quickly " << i % 9 << ", row " << i % 23 << ".\n";
    }
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(TensorParallelCliTest, LaunchedLayoutsWriteTheLossesOfTheOneProcessRun) {
  const std::string config_file = (dir_ / "run.toml").string();
  std::ofstream(config_file) << "[model]\npreset = \"tiny\"\nvocab_size = 260\n[data]\ncorpus = \""
                             << (dir_ / "corpus.txt").string() << "\"\nseq_len = 32\n[train]\n"
                             << "steps = 3\nsample_tokens = 8\n[run]\nthreads = 1\n";
  const std::string train = testing::cli() + " train --config " + config_file;
  const auto one =
      testing::run_command(testing::cli() + " launch --nproc 1 -- " + train +
                           " --set train.micro_batch=8 --set run.dir=" + (dir_ / "one").string());
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const auto want = testing::rank0_losses(dir_ / "one" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 3u);
  struct Layout {
    std::string name, settings, says;
  };
  for (const Layout& layout :
       {Layout{"tp2_dp2",
               "--set parallel.tp=2 --set parallel.strategy=ddp --set train.micro_batch=4",
               "tensor parallel over groups of 2 ranks, 2 data-parallel rank(s)"},
        Layout{"tp4",
               "--set parallel.tp=4 --set parallel.sequence_parallel=true "
               "--set train.micro_batch=8",
               "tensor parallel over groups of 4 ranks with sequence parallelism, 1 "
               "data-parallel rank(s)"}}) {
    SCOPED_TRACE(layout.name);
    const fs::path run_dir = dir_ / layout.name;
    const auto four = testing::run_command(testing::cli() + " launch --nproc 4 -- " + train + " " +
                                           layout.settings + " --set run.dir=" + run_dir.string());
    ASSERT_EQ(four.exit_code, 0) << four.output;
    EXPECT_NE(four.output.find(layout.says), std::string::npos) << four.output;
    EXPECT_NE(four.output.find("sample: "), std::string::npos) << four.output;
    testing::expect_same_losses(testing::rank0_losses(run_dir / "metrics.jsonl"), want, 1e-5);
    // Each rank reports the time its tensor-parallel collectives took.
    std::ifstream in(run_dir / "metrics.jsonl");
    std::string line;
    std::getline(in, line);
    const auto comm = nlohmann::json::parse(line).at("comm");
    EXPECT_GT(comm.at("tp_seconds").get<double>(), 0.0) << line;
    EXPECT_GT(comm.at("tp_bytes").get<int64_t>(), 0) << line;
  }
  // A world the tensor-parallel size does not divide: one clear line, nothing written.
  const auto bad =
      testing::run_command(testing::cli() + " launch --nproc 2 -- " + train +
                           " --set parallel.tp=4 --set run.dir=" + (dir_ / "bad").string());
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("world size 2 is not divisible by parallel.tp=4"), std::string::npos)
      << bad.output;
  EXPECT_FALSE(fs::exists(dir_ / "bad" / "metrics.jsonl"));
}

// The planner's TP x DP layout of a small model, written as it is, trains at 4 ranks.
TEST_F(TensorParallelCliTest, ThePlannersTensorParallelTomlRuns) {
  const Plan plan = make_plan(PlanModel::from_config(model_preset("tiny")),
                              ClusterOptions().gpus_per_node(4).nodes(1),
                              WorkloadOptions().seq_len(32).micro_batch(2).precision("fp32"));
  const Candidate* tp = nullptr;
  for (const auto& c : plan.candidates) {
    if (c.valid && c.strategy == PlanStrategy::kTpPp && c.tp == 2 && c.pp == 1) tp = &c;
  }
  ASSERT_NE(tp, nullptr);
  const std::string toml = shardtrain_toml(plan, *tp);
  EXPECT_NE(toml.find("tp = 2"), std::string::npos) << toml;
  EXPECT_NE(toml.find("vocab_size = 512"), std::string::npos) << toml;  // 257 padded
  testing::expect_planned_toml_trains(dir_, toml, 4);
}

}  // namespace tp_cli_test
}  // namespace shardtrain
