// The Llama decoder's variants (Llama 3.2: scaled RoPE and a tied head; Qwen2: q/k/v biases;
// Qwen3: head norms and wider heads; Mistral) under every strategy the trainer has: the losses of
// one process on the same global batch, and a checkpoint written under one strategy that resumes
// under another with the losses of the uninterrupted run.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>

#include "shardtrain/train.h"
#include "support.h"
#include "train/local_training.h"
#include "train/run_config.h"

namespace shardtrain {
namespace families_trainer_test {

namespace fs = std::filesystem;

struct Layout {
  std::string name;
  int world;
  std::vector<std::string> keys;
};

class FamiliesTrainerTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = testing::fresh_test_dir("shardtrain_families");
    std::ofstream corpus(dir_ / "corpus.txt");
    for (int i = 0; i < 200; ++i) {
      corpus << "the quick brown fox " << i % 7 << " jumps over the lazy dog " << i % 5 << ".\n";
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The family's tiny preset with a vocabulary that divides by 2 (tensor parallelism), four
  // micro-batches of 2 sequences per step (the pipeline's), eps as in the tp and pp tests.
  TrainConfig config(const Layout& layout, const std::string& run,
                     const std::vector<std::string>& more = {}) const {
    std::vector<std::string> all = {"model.preset=\"" + GetParam() + "\"",
                                    "model.vocab_size=260",
                                    "data.seq_len=16",
                                    "train.grad_accum=4",
                                    "train.micro_batch=2",
                                    "train.steps=4",
                                    "train.lr=3e-3",
                                    "train.eps=1e-6"};
    all.insert(all.end(), layout.keys.begin(), layout.keys.end());
    all.insert(all.end(), more.begin(), more.end());
    return testing::tiny_run_config(dir_ / "corpus.txt", dir_ / run, all);
  }

  fs::path dir_;
};

TEST_P(FamiliesTrainerTest, EveryStrategyTrainsAsOneProcess) {
  const Layout one{"one", 1, {}};
  const auto want = testing::train_on_ranks(1, config(one, "one"), 4);
  // Under data parallelism each rank takes half of a micro-batch's sequences.
  const std::vector<Layout> layouts = {
      {"ddp", 2, {"parallel.strategy=\"ddp\"", "train.micro_batch=1"}},
      {"fsdp", 2, {"parallel.strategy=\"fsdp\"", "train.micro_batch=1"}},
      {"zero3", 2, {"parallel.strategy=\"zero\"", "parallel.zero.stage=3", "train.micro_batch=1"}},
      {"tp2_sp", 2, {"parallel.tp=2", "parallel.sequence_parallel=true"}},
      {"pp2", 2, {"parallel.pp=2"}}};
  for (const Layout& layout : layouts) {
    SCOPED_TRACE(layout.name);
    testing::expect_same_losses(
        testing::train_on_ranks(layout.world, config(layout, layout.name), 4), want, 1e-5);
  }
  // LoRA and QLoRA: the adapters' training, one process against two.
  for (const std::string base : {"fp32", "nf4"}) {
    SCOPED_TRACE("lora on " + base);
    const std::vector<std::string> lora = {"lora.rank=4", "lora.alpha=8",
                                           "lora.base_dtype=\"" + base + "\""};
    const auto single = testing::train_on_ranks(1, config(one, "lora_one_" + base, lora), 4);
    const Layout fsdp{"lora_fsdp", 2, {"parallel.strategy=\"fsdp\"", "train.micro_batch=1"}};
    testing::expect_same_losses(
        testing::train_on_ranks(2, config(fsdp, "lora_fsdp_" + base, lora), 4), single, 1e-5);
  }
}

TEST_P(FamiliesTrainerTest, CheckpointResumesUnderAnotherStrategy) {
  const Layout one{"one", 1, {}};
  const auto want = testing::train_on_ranks(1, config(one, "whole"), 4);
  const Layout fsdp{"fsdp", 2, {"parallel.strategy=\"fsdp\"", "train.micro_batch=1"}};
  std::string checkpoint;
  testing::train_on_ranks(2, config(fsdp, "first"), 2, &checkpoint);
  for (const Layout& layout :
       {Layout{"zero3",
               2,
               {"parallel.strategy=\"zero\"", "parallel.zero.stage=3", "train.micro_batch=1"}},
        Layout{"tp2", 2, {"parallel.tp=2"}}, Layout{"pp2", 2, {"parallel.pp=2"}}}) {
    SCOPED_TRACE("resumed under " + layout.name);
    const auto rest = testing::train_on_ranks(
        layout.world,
        config(layout, "resumed_" + layout.name, {"run.resume=\"" + checkpoint + "\""}), 2);
    testing::expect_same_losses(rest, {want[2], want[3]}, 1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, FamiliesTrainerTest,
                         ::testing::Values("tiny-llama3.2", "tiny-qwen2", "tiny-qwen3",
                                           "tiny-mistral"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& ch : name) ch = std::isalnum(ch) ? ch : '_';
                           return name;
                         });

}  // namespace families_trainer_test
}  // namespace shardtrain
