#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "shardtrain/data.h"
#include "shardtrain/rendezvous.h"
#include "shardtrain/train.h"
#include "support.h"
#include "train/run_config.h"

namespace shardtrain {
namespace trainer_test {

namespace fs = std::filesystem;

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::fresh_test_dir("shardtrain_trainer");
    testing::write_trainer_corpus(dir_ / "corpus.txt");
  }
  void TearDown() override { fs::remove_all(dir_); }

  TrainConfig config(const std::vector<std::string>& overrides = {}) const {
    std::vector<std::string> all = {"train.micro_batch=4", "train.steps=6"};
    all.insert(all.end(), overrides.begin(), overrides.end());
    return testing::tiny_run_config(dir_ / "corpus.txt", dir_ / "run", all);
  }

  fs::path dir_;
};

TEST_F(TrainerTest, AccumulatingMicroBatchesEqualsOneLargerBatch) {
  // The gradient of the first step (taken after backward, before the optimizer) and the losses
  // of the following steps. Parameters are not compared after several steps: AdamW divides by
  // sqrt(v), which magnifies summation-order differences of near-zero gradients.
  auto run = [&](const std::vector<std::string>& overrides, std::vector<at::Tensor>& grads) {
    Trainer trainer(config(overrides));
    trainer.set_after_backward([&](int64_t step) {
      if (step != 0) return;
      for (const auto& p : trainer.model()->parameters()) grads.push_back(p.grad().clone());
    });
    return testing::step_losses(trainer, 4);
  };
  std::vector<at::Tensor> grads_one, grads_four;
  const auto a = run({"train.micro_batch=4", "train.grad_accum=1"}, grads_one);
  const auto b = run(
      {"train.micro_batch=1", "train.grad_accum=4", "run.dir=\"" + (dir_ / "b").string() + "\""},
      grads_four);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * std::abs(a[i])) << i;
  ASSERT_EQ(grads_one.size(), grads_four.size());
  for (size_t i = 0; i < grads_one.size(); ++i) {
    EXPECT_TRUE(at::allclose(grads_one[i], grads_four[i], 1e-5, 1e-7)) << "gradient " << i;
  }
}

TEST_F(TrainerTest, ResumeReproducesTheUninterruptedLossesExactly) {
  const auto base = config({"model.dropout=0.1", "train.checkpoint_every=3"});
  Trainer uninterrupted(base);
  const auto all = testing::step_losses(uninterrupted, 6);
  uninterrupted.save_checkpoint();

  TrainConfig resumed_config = base;
  resumed_config.run.resume = (dir_ / "run" / "checkpoints" / "step_000003").string();
  // Checkpoints are written by fit(); make the step-3 one the same way.
  TrainConfig first_half = base;
  first_half.run.dir = (dir_ / "half").string();
  first_half.train.steps = 3;
  Trainer half(first_half);
  const auto head = testing::step_losses(half, 3);
  const std::string saved = half.save_checkpoint();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(head[i], all[i]) << "step " << i + 1;

  resumed_config.run.resume = saved;
  // A run dir of its own: "run" belongs to `uninterrupted`, alive till the end of the test.
  resumed_config.run.dir = (dir_ / "resumed").string();
  Trainer resumed(resumed_config);
  EXPECT_EQ(resumed.step(), 3);
  const auto tail = testing::step_losses(resumed, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(tail[i], all[i + 3]) << "step " << i + 4;
}

TEST_F(TrainerTest, LossScalingSkipsAnInjectedOverflowAndRecovers) {
  Trainer trainer(config({"precision.loss_scale=\"dynamic\"", "precision.initial_scale=1024",
                          "precision.scale_window=2"}));
  trainer.set_after_backward([&](int64_t step) {
    if (step == 2) trainer.model()->parameters()[0].mutable_grad()[0][0] = INFINITY;
  });
  testing::step_losses(trainer, 2);
  EXPECT_DOUBLE_EQ(trainer.loss_scaler().scale(), 2048.0);  // grew after 2 good steps
  std::vector<at::Tensor> before;
  for (const auto& p : trainer.model()->parameters()) before.push_back(p.detach().clone());
  const StepResult overflow = trainer.train_step();
  EXPECT_TRUE(overflow.skipped);
  EXPECT_DOUBLE_EQ(trainer.loss_scaler().scale(), 1024.0);
  const auto after = trainer.model()->parameters();
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(at::equal(before[i], after[i]));
  const StepResult next = trainer.train_step();
  EXPECT_FALSE(next.skipped);
  EXPECT_TRUE(std::isfinite(next.loss));
  EXPECT_FALSE(at::equal(before[0], trainer.model()->parameters()[0]));
  trainer.train_step();
  EXPECT_DOUBLE_EQ(trainer.loss_scaler().scale(), 2048.0);
  EXPECT_EQ(trainer.loss_scaler().skipped_steps(), 1);
}

TEST_F(TrainerTest, ActivationCheckpointingKeepsTheLosses) {
  // One after the other: each trainer seeds the global generator when it is built.
  Trainer plain(config({"model.dropout=0.1"}));
  const auto a = testing::step_losses(plain, 3);
  Trainer checkpointed(config({"model.dropout=0.1", "train.activation_checkpointing=true",
                               "run.dir=\"" + (dir_ / "ac").string() + "\""}));
  const auto b = testing::step_losses(checkpointed, 3);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << i;  // recomputation is exact
}

TEST_F(TrainerTest, Bf16AutocastStaysCloseToFp32) {
  Trainer fp32(config());
  const auto a = testing::step_losses(fp32, 3);
  Trainer bf16(
      config({"precision.autocast=\"bf16\"", "run.dir=\"" + (dir_ / "bf").string() + "\""}));
  const auto b = testing::step_losses(bf16, 3);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 0.02 * a[i]) << i;
}

TEST_F(TrainerTest, FitWritesMetricsCheckpointsAndASample) {
  Trainer trainer(
      config({"train.steps=3", "train.eval_every=2", "train.sample_tokens=5", "run.log_every=1"}));
  trainer.fit();
  std::ifstream in(dir_ / "run" / "metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(in, line); ++lines) {
    const auto j = nlohmann::json::parse(line);
    for (const char* key : {"step", "rank", "loss", "lr", "tokens_per_s", "step_time_s"}) {
      EXPECT_TRUE(j.contains(key)) << key;
    }
    for (const char* key : {"params", "grads", "optim", "activations_peak", "peak_rss"}) {
      EXPECT_TRUE(j.at("mem").contains(key)) << key;
    }
    EXPECT_GT(j.at("mem").at("params").get<int64_t>(), 0);
    EXPECT_GT(j.at("mem").at("activations_peak").get<int64_t>(), 0);
    EXPECT_EQ(j.at("mem").at("optim").get<int64_t>(), 2 * j.at("mem").at("params").get<int64_t>());
    EXPECT_EQ(j.contains("eval_loss"), j.at("step").get<int>() >= 2);
  }
  EXPECT_EQ(lines, 3);
  EXPECT_TRUE(fs::exists(dir_ / "run" / "checkpoints" / "step_000003" / "index.json"));
  EXPECT_TRUE(fs::exists(dir_ / "run" / "checkpoints" / "step_000003" / "rank_00000.safetensors"));
  EXPECT_EQ(trainer.generate("the ", 5).rfind("the ", 0), 0u);
}

TEST_F(TrainerTest, BadInputIsNamed) {
  auto message = [&](const std::vector<std::string>& overrides) {
    try {
      Trainer trainer(config(overrides));
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message({"data.corpus=\"/nonexistent/corpus.txt\""}).find("/nonexistent/corpus.txt"),
            std::string::npos);
  EXPECT_NE(message({"data.tokenizer=\"gpt2\"", "data.gpt2_dir=\"/nonexistent/gpt2\""})
                .find("/nonexistent/gpt2/encoder.json"),
            std::string::npos);
  EXPECT_NE(message({"model.vocab_size=100"}).find("model.vocab_size 100"), std::string::npos);

  const std::string shard = (dir_ / "cut.tokens").string();
  write_token_shard(shard, std::vector<int32_t>(1000, 3), 257);
  fs::resize_file(shard, fs::file_size(shard) - 1);
  EXPECT_NE(message({"data.corpus=\"" + shard + "\""}).find("truncated"), std::string::npos);
}

TEST_F(TrainerTest, CommandLineTrainsAndRefusesBadKeys) {
  const std::string config_file = (dir_ / "run.toml").string();
  std::ofstream(config_file) << "[model]\npreset = \"tiny\"\n[data]\ncorpus = \""
                             << (dir_ / "corpus.txt").string() << "\"\nseq_len = 32\n[train]\n"
                             << "steps = 2\nmicro_batch = 2\nsample_tokens = 4\n[run]\ndir = \""
                             << (dir_ / "cli").string() << "\"\n";
  auto ok = testing::run_command(testing::cli() + " train --config " + config_file +
                                 " --set run.log_every=1");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("step     2/2"), std::string::npos) << ok.output;
  EXPECT_NE(ok.output.find("sample: "), std::string::npos) << ok.output;
  auto bad = testing::run_command(testing::cli() + " train --config " + config_file +
                                  " --set train.stepz=3");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("unknown config key 'train.stepz'"), std::string::npos) << bad.output;
}

TEST_F(TrainerTest, DdpOnTwoRanksMatchesOneProcessAtTheSameGlobalBatch) {
  Trainer single(config({"train.micro_batch=4", "train.grad_accum=2"}));
  const auto expected = testing::step_losses(single, 5);
  std::vector<double> got;
  run_local_ranks(
      2,
      [&](ProcessGroup& group) {
        auto world = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
        Trainer trainer(
            config({"parallel.strategy=\"ddp\"", "train.micro_batch=2", "train.grad_accum=2",
                    "run.dir=\"" + (dir_ / "ddp").string() + "\""}),
            world);
        EXPECT_EQ(trainer.data().global_batch_size(), 8);
        const auto mine = testing::step_losses(trainer, 5);
        if (group.rank() == 0) got = mine;
      },
      ProcessGroupOptions().timeout(std::chrono::seconds(120)));
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], expected[i], 1e-5 * expected[i]) << "step " << i + 1;
  }
}

TEST_F(TrainerTest, LaunchedDdpWritesTheLossesOfTheOneProcessRun) {
  const std::string config_file = (dir_ / "run.toml").string();
  std::ofstream(config_file) << "[model]\npreset = \"tiny\"\n[data]\ncorpus = \""
                             << (dir_ / "corpus.txt").string() << "\"\nseq_len = 32\n[train]\n"
                             << "steps = 4\nsample_tokens = 0\n[run]\nthreads = 1\n";
  const std::string train = testing::cli() + " train --config " + config_file;
  auto one =
      testing::run_command(testing::cli() + " launch --nproc 1 -- " + train +
                           " --set train.micro_batch=4 --set run.dir=" + (dir_ / "one").string());
  ASSERT_EQ(one.exit_code, 0) << one.output;
  auto two = testing::run_command(testing::cli() + " launch --nproc 2 -- " + train +
                                  " --set train.micro_batch=2 --set parallel.strategy=ddp " +
                                  "--set run.dir=" + (dir_ / "two").string());
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_NE(two.output.find("data parallel (ddp) over 2 ranks"), std::string::npos) << two.output;
  const auto a = testing::rank0_losses(dir_ / "one" / "metrics.jsonl");
  const auto b = testing::rank0_losses(dir_ / "two" / "metrics.jsonl");
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * a[i]) << "step " << i + 1;

  auto refused = testing::run_command(testing::cli() + " launch --nproc 2 -- " + train +
                                      " --set run.dir=" + (dir_ / "three").string());
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.output.find("set parallel.strategy = \"ddp\""), std::string::npos)
      << refused.output;
}

}  // namespace trainer_test
}  // namespace shardtrain
