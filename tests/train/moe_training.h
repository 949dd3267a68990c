// The mixture-of-experts trainer tests' runs (moe_trainer_test.cpp, ep_trainer_test.cpp): tiny-moe
// or tiny-qwen3-moe on a small corpus, a global batch of 8 sequences of 16 tokens, every rank
// training the same config, rank 0's step results (routing included) and final checkpoint back.
#pragma once

#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/rendezvous.h"
#include "shardtrain/train.h"
#include "support.h"
#include "train/run_config.h"

namespace shardtrain::testing {

// A layout: its name (also the run directory's), the ranks, and the settings that make it.
struct MoeLayout {
  std::string name;
  int world;
  std::vector<std::string> keys;
};

// Rank 0's step results, and the checkpoint written after the last step.
struct MoeRun {
  std::vector<StepResult> steps;
  std::string checkpoint;
  std::vector<double> losses() const {
    std::vector<double> out;
    for (const auto& s : steps) out.push_back(s.loss);
    return out;
  }
};

inline MoeRun run_moe(int world, const TrainConfig& cfg, int steps) {
  MoeRun run;
  auto body = [&](const std::shared_ptr<ProcessGroup>& group) {
    Trainer trainer(cfg, group);
    std::vector<StepResult> mine;
    for (int i = 0; i < steps; ++i) mine.push_back(trainer.train_step());
    const std::string dir = trainer.save_checkpoint();
    if (!group || group->rank() == 0) {
      run.steps = mine;
      run.checkpoint = dir;
    }
  };
  if (world == 1) {
    body(nullptr);
  } else {
    run_local_ranks(world, [&](ProcessGroup& group) {
      body(std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {}));
    });
  }
  return run;
}

// The same load-balancing loss (1e-5 relative) and tokens per expert at every step.
inline void expect_same_routing(const MoeRun& got, const MoeRun& want) {
  ASSERT_EQ(got.steps.size(), want.steps.size());
  for (size_t i = 0; i < want.steps.size(); ++i) {
    const StepResult &g = got.steps[i], &w = want.steps[i];
    EXPECT_NEAR(g.aux_loss, w.aux_loss, 1e-5 * w.aux_loss) << "step " << i + 1;
    EXPECT_EQ(g.expert_tokens_min, w.expert_tokens_min) << "step " << i + 1;
    EXPECT_EQ(g.expert_tokens_max, w.expert_tokens_max) << "step " << i + 1;
    EXPECT_EQ(g.expert_tokens_mean, w.expert_tokens_mean) << "step " << i + 1;
  }
}

// Parameterized by the preset. One process takes 4 micro-batches of 2 sequences; a layout's
// keys set its micro-batches so that micro_batch x grad_accum x dp = 8.
class MoeTrainingTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = fresh_test_dir("shardtrain_moe");
    std::ofstream corpus(dir_ / "corpus.txt");
    for (int i = 0; i < 200; ++i) {
      corpus << "sphinx of black quartz " << i % 7 << ", judge my vow " << i % 5 << ".\n";
    }
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  TrainConfig config(const MoeLayout& layout, const std::string& run,
                     const std::vector<std::string>& more = {}) const {
    std::vector<std::string> all = {"model.preset=\"" + GetParam() + "\"",
                                    "model.vocab_size=260",
                                    "data.seq_len=16",
                                    "train.grad_accum=4",
                                    "train.micro_batch=2",
                                    "train.steps=" + std::to_string(steps_),
                                    "train.lr=3e-3",
                                    "train.eps=1e-6"};
    all.insert(all.end(), layout.keys.begin(), layout.keys.end());
    all.insert(all.end(), more.begin(), more.end());
    return tiny_run_config(dir_ / "corpus.txt", dir_ / run, all);
  }

  std::filesystem::path dir_;
  int64_t steps_ = 10;  // train.steps: the schedule's length
};

// The test names of the presets ("tiny_moe").
inline std::string preset_test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  for (char& ch : name) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return name;
}

}  // namespace shardtrain::testing
