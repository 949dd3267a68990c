// Pipeline parallelism through the command line: launched runs at pp = 2 x dp = 2 and at pp = 4
// write the losses of the one-process run, and the planner's pipelined TOML trains.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "shardtrain/plan.h"
#include "support.h"

namespace shardtrain {
namespace pp_cli_test {

namespace fs = std::filesystem;

class PipelineCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::fresh_test_dir("shardtrain_pp_cli");
    std::ofstream corpus(dir_ / "corpus.txt");
    for (int i = 0; i < 300; ++i) {
      corpus << "how vexingly quick daft zebras jump " << i % 9 << ", row " << i % 23 << ".\n";
    }
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(PipelineCliTest, LaunchedLayoutsWriteTheLossesOfTheOneProcessRun) {
  const std::string config_file = (dir_ / "run.toml").string();
  std::ofstream(config_file)
      << "[model]\npreset = \"tiny\"\nn_layers = 4\n[data]\ncorpus = \""
      << (dir_ / "corpus.txt").string() << "\"\nseq_len = 32\n[train]\n"
      << "steps = 3\ngrad_accum = 4\nsample_tokens = 8\n[run]\nthreads = 1\n";
  const std::string train = testing::cli() + " train --config " + config_file;
  const auto one =
      testing::run_command(testing::cli() + " launch --nproc 1 -- " + train +
                           " --set train.micro_batch=2 --set run.dir=" + (dir_ / "one").string());
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const auto want = testing::rank0_losses(dir_ / "one" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 3u);
  struct Layout {
    std::string name, settings, says;
  };
  for (const Layout& layout :
       {Layout{"pp2_dp2",
               "--set parallel.pp=2 --set parallel.strategy=ddp --set train.micro_batch=1",
               "pipeline parallel over 2 ranks (1f1b, 2 stage(s) of [2, 2] blocks), 4 "
               "micro-batches per step"},
        Layout{
            "pp4",
            "--set parallel.pp=4 --set parallel.pp_schedule=zero_bubble "
            "--set train.micro_batch=2",
            "pipeline parallel over 4 ranks (zero_bubble, 4 stage(s) of [1, 1, 1, 1] blocks)"}}) {
    SCOPED_TRACE(layout.name);
    const fs::path run_dir = dir_ / layout.name;
    const auto four = testing::run_command(testing::cli() + " launch --nproc 4 -- " + train + " " +
                                           layout.settings + " --set run.dir=" + run_dir.string());
    ASSERT_EQ(four.exit_code, 0) << four.output;
    EXPECT_NE(four.output.find(layout.says), std::string::npos) << four.output;
    EXPECT_NE(four.output.find("sample: "), std::string::npos) << four.output;
    testing::expect_same_losses(testing::rank0_losses(run_dir / "metrics.jsonl"), want, 1e-5);
    // Each rank reports when its stage was busy within the step.
    std::ifstream in(run_dir / "metrics.jsonl");
    std::string line;
    std::getline(in, line);
    const auto pipeline = nlohmann::json::parse(line).at("pipeline");
    EXPECT_GT(pipeline.at("busy_s").get<double>(), 0.0) << line;
    EXPECT_LE(pipeline.at("busy_s").get<double>(), pipeline.at("span_s").get<double>()) << line;
  }
  // A world the pipeline does not divide: one clear line, nothing written.
  const auto bad = testing::run_command(
      testing::cli() + " launch --nproc 3 -- " + train +
      " --set parallel.pp=2 --set parallel.strategy=ddp --set run.dir=" + (dir_ / "bad").string());
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("world size 3 is not divisible by parallel.pp=2"), std::string::npos)
      << bad.output;
  EXPECT_FALSE(fs::exists(dir_ / "bad" / "metrics.jsonl"));
}

// The planner's TP x PP x DP layout of a small model (ZeRO-1 across the data-parallel ranks),
// written as it is, trains at 8 ranks.
TEST_F(PipelineCliTest, ThePlannersPipelinedTomlRuns) {
  ModelConfig model = model_preset("tiny");
  model.n_layers = 4;
  const Plan plan =
      make_plan(PlanModel::from_config(model), ClusterOptions().gpus_per_node(8).nodes(1),
                WorkloadOptions().seq_len(32).micro_batch(1).global_batch(8).precision("fp32"));
  const Candidate* layout = nullptr;
  for (const auto& c : plan.candidates) {
    if (c.valid && c.strategy == PlanStrategy::kTpPp && c.tp == 2 && c.pp == 2) layout = &c;
  }
  ASSERT_NE(layout, nullptr);
  const std::string toml = shardtrain_toml(plan, *layout);
  EXPECT_NE(toml.find("pp = 2"), std::string::npos) << toml;
  testing::expect_planned_toml_trains(dir_, toml, 8);
}

TEST(PipelineBenchCli, ASettingThatDoesNotFitIsNamedByItsFlag) {
  const auto run = testing::run_command(testing::cli() +
                                        " bench pipeline --pp 4 --schedule interleaved_1f1b "
                                        "--virtual-stages 3 --microbatches 5");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("--schedule \"interleaved_1f1b\" sends micro-batches round"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("make --microbatches a multiple of 4"), std::string::npos)
      << run.output;
  EXPECT_EQ(run.output.find("train.grad_accum"), std::string::npos) << run.output;
}

}  // namespace pp_cli_test
}  // namespace shardtrain
