// `shardtrain train --deepspeed / --accelerate-config` with the example configs: the imported
// settings train the same losses as the same run spelled with --set, or as one process on the
// same global batch.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "support.h"

namespace shardtrain {
namespace import_cli_test {

namespace fs = std::filesystem;

const std::string kConfigs = std::string(SHARDTRAIN_SOURCE_DIR) + "/configs/";

class ImportCliTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::fresh_test_dir("shardtrain_import_cli"); }
  void TearDown() override { fs::remove_all(dir_); }

  // `shardtrain launch --nproc N -- shardtrain train` on the tiny example TOML, 3 steps, on a
  // small text corpus.
  testing::CommandResult train(int nproc, const std::string& name, const std::string& flags) {
    const fs::path corpus = dir_ / "corpus.txt";
    if (!fs::exists(corpus)) {
      std::ofstream out(corpus);
      for (int i = 0; i < 300; ++i) {
        out << "the quick brown fox " << i % 7 << " jumps over the lazy dog " << i % 11 << ".\n";
      }
    }
    return testing::run_command(
        testing::cli() + " launch --nproc " + std::to_string(nproc) + " -- " + testing::cli() +
        " train --config " + kConfigs + "zero_tiny.toml --set train.steps=3 --set data.corpus=" +
        corpus.string() + " --set run.dir=" + (dir_ / name).string() + " " + flags);
  }

  fs::path dir_;
};

TEST_F(ImportCliTest, AccelerateFsdpExampleTrainsLikeTheSameSettingsBySet) {
  auto imported = train(2, "imported", "--accelerate-config " + kConfigs + "accelerate_fsdp.yaml");
  ASSERT_EQ(imported.exit_code, 0) << imported.output;
  EXPECT_NE(imported.output.find("fsdp full_shard over 2 rank(s)"), std::string::npos)
      << imported.output;
  auto by_set = train(2, "by_set",
                      "--set parallel.strategy=fsdp --set parallel.fsdp.wrap=class --set "
                      "'parallel.fsdp.wrap_classes=[\"GPT2Block\"]' --set "
                      "precision.param_dtype=bf16 --set precision.reduce_dtype=bf16 --set "
                      "precision.buffer_dtype=bf16");
  ASSERT_EQ(by_set.exit_code, 0) << by_set.output;
  const auto want = testing::rank0_losses(dir_ / "by_set" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 3u);
  testing::expect_same_losses(testing::rank0_losses(dir_ / "imported" / "metrics.jsonl"), want,
                              1e-6);
}

TEST_F(ImportCliTest, DeepSpeedZeroTwoExampleMatchesOneProcessOnTheGlobalBatch) {
  // ds_zero2.json: train_batch_size 16 (micro 4 x accumulation 2 x 2 ranks), WarmupDecayLR.
  auto one = train(1, "one",
                   "--set train.micro_batch=16 --set train.grad_accum=1 --set "
                   "train.schedule=linear --set train.min_lr=0");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  auto two = train(2, "two", "--deepspeed " + kConfigs + "ds_zero2.json");
  ASSERT_EQ(two.exit_code, 0) << two.output;
  const auto want = testing::rank0_losses(dir_ / "one" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 3u);
  testing::expect_same_losses(testing::rank0_losses(dir_ / "two" / "metrics.jsonl"), want, 1e-5);
  // Every "auto" is told once (by rank 0) with the value it became.
  const std::string told = kConfigs + "ds_zero2.json: 'optimizer.params.lr' left to the TOML " +
                           "config: train.lr = 0.003";
  const auto first = two.output.find(told);
  EXPECT_NE(first, std::string::npos) << two.output;
  EXPECT_EQ(two.output.find(told, first + 1), std::string::npos) << two.output;
}

TEST_F(ImportCliTest, AnOptimizerWithoutASchedulerTrainsAtItsRateThroughout) {
  // DeepSpeed keeps the optimizer's rate when there is no scheduler; 1e-5 is below the TOML's
  // min_lr, which a constant schedule never reaches.
  const fs::path ds = dir_ / "ds.json";
  std::ofstream(ds) << R"({"train_micro_batch_size_per_gpu": 4,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-5}}, "prescale_gradients": false})";
  auto r = train(1, "constant", "--deepspeed " + ds.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("'scheduler' absent: a constant learning rate without warmup"),
            std::string::npos)
      << r.output;
  const nlohmann::json run = nlohmann::json::parse(std::ifstream(dir_ / "constant" / "run.json"));
  EXPECT_EQ(run["train"]["schedule"], "constant");
  EXPECT_EQ(run["train"]["warmup"], 0);
  EXPECT_DOUBLE_EQ(run["train"]["lr"].get<double>(), 1e-5);
  EXPECT_EQ(run["train"]["micro_batch"], 4);
  std::ifstream metrics(dir_ / "constant" / "metrics.jsonl");
  int steps = 0;
  for (std::string line; std::getline(metrics, line);) {
    const auto record = nlohmann::json::parse(line);
    if (!record.contains("lr")) continue;
    EXPECT_DOUBLE_EQ(record["lr"].get<double>(), 1e-5) << line;
    ++steps;
  }
  EXPECT_EQ(steps, 3);
}

TEST_F(ImportCliTest, DeepSpeedZeroThreeOffloadExampleMatchesOneProcessInBf16) {
  // ds_zero3_offload.json: micro 2 x accumulation 4, bf16, optimizer and parameters offloaded
  // to host memory. One process at micro 4 sees the same global batch of 16 as two ranks at 2,
  // with the same bf16 policy; bf16 reductions round differently, hence 1e-2.
  const std::string flags = "--deepspeed " + kConfigs + "ds_zero3_offload.json";
  auto one = train(1, "one", flags + " --set train.micro_batch=4");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  auto two = train(2, "two", flags);
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_NE(two.output.find("zero stage 3 over 2 rank(s)"), std::string::npos) << two.output;
  const auto want = testing::rank0_losses(dir_ / "one" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 3u);
  testing::expect_same_losses(testing::rank0_losses(dir_ / "two" / "metrics.jsonl"), want, 1e-2);
}

TEST_F(ImportCliTest, BadImportedFilesExitWithOneClearMessage) {
  const fs::path ds = dir_ / "bad.json";
  std::ofstream(ds) << R"({"zero_optimization": {"stage": 2, "stage3_foo": 1}})";
  auto r = testing::run_command(testing::cli() + " train --config " + kConfigs +
                                "zero_tiny.toml --deepspeed " + ds.string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("'zero_optimization.stage3_foo'"), std::string::npos) << r.output;
  // The example is written for two processes; one process is a mismatch.
  r = testing::run_command("env -u WORLD_SIZE " + testing::cli() + " train --config " + kConfigs +
                           "zero_tiny.toml --accelerate-config " + kConfigs +
                           "accelerate_fsdp.yaml");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("'num_processes' = '2'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("1 rank(s)"), std::string::npos) << r.output;
}

TEST_F(ImportCliTest, ARefusalOfAnImportedSettingNamesTheFile) {
  // The model refuses the quantization groups the file names (a BERT layer this model lacks),
  // and the config's check refuses layer dropping with ZeRO-3: both messages start with the file.
  const fs::path ds = dir_ / "bert_groups.json";
  std::ofstream(ds) << R"({"train_micro_batch_size_per_gpu": 1, "compression_training": {
      "weight_quantization": {"shared_parameters": {"enabled": true,
                                                    "quantize_weight_in_forward": true},
        "different_groups": {"wq1": {"params": {"start_bits": 8, "target_bits": 8},
                                     "modules": ["attention.self"]}}}}})";
  auto r = train(1, "groups", "--deepspeed " + ds.string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(ds.string() + ": compression.weight_modules: 'attention.self' matches "
                                        "no linear layer"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("(compression.weight_modules is this file's setting)"), std::string::npos)
      << r.output;
  const fs::path pld = dir_ / "pld_zero3.json";
  std::ofstream(pld) << R"({"train_micro_batch_size_per_gpu": 1,
      "zero_optimization": {"stage": 3}, "progressive_layer_drop": {"enabled": true}})";
  r = train(1, "pld", "--deepspeed " + pld.string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(pld.string() + ": train.layer_drop = \"progressive\" runs"),
            std::string::npos)
      << r.output;
  // A key --set gives is the command line's: the message is the config's own.
  r = train(1, "set", "--deepspeed " + pld.string() + " --set train.layer_drop=\"progressive\"");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output.find(pld.string() + ": train.layer_drop"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("train.layer_drop = \"progressive\" runs"), std::string::npos)
      << r.output;
}

}  // namespace import_cli_test
}  // namespace shardtrain
