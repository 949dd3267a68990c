// Expert parallelism in the trainer (tiny-moe, tiny-qwen3-moe): experts split over ep = 2 and 4
// ranks, alone (DDP), with FSDP (the experts sharded over the ranks holding the same ones, or
// not at all when ep covers every data-parallel rank), ZeRO, tensor parallelism and pipeline
// stages, train 10 steps as one process does on the same global batch (losses, the
// load-balancing loss, the tokens per expert, the final parameters); a checkpoint resumes at
// another ep; settings that cannot split are refused with one message each.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "shardtrain/sharded_checkpoint.h"
#include "shardtrain/train.h"
#include "support.h"
#include "train/local_training.h"
#include "train/moe_training.h"

namespace shardtrain {
namespace ep_trainer_test {

namespace fs = std::filesystem;
using Layout = testing::MoeLayout;
using RankRun = testing::MoeRun;
using testing::expect_same_routing;

class ExpertParallelTrainerTest : public testing::MoeTrainingTest {};

// Two data-parallel ranks take micro-batches of 1 (4 each); four take micro-batches of 1, 2 each.
const std::vector<std::string> kTwoDp = {"train.micro_batch=1"};
const std::vector<std::string> kFourDp = {"train.micro_batch=1", "train.grad_accum=2"};

std::vector<std::string> with(std::vector<std::string> keys, const std::vector<std::string>& more) {
  keys.insert(keys.end(), more.begin(), more.end());
  return keys;
}

TEST_P(ExpertParallelTrainerTest, EveryLayoutTrainsAsOneProcess) {
  const RankRun want = testing::run_moe(1, config(Layout{"one", 1, {}}, "one"), 10);
  const std::string ddp = "parallel.strategy=\"ddp\"", fsdp = "parallel.strategy=\"fsdp\"";
  const std::vector<Layout> layouts = {
      {"ep2", 2, with({ddp, "parallel.ep=2"}, kTwoDp)},
      {"ep4", 4, with({ddp, "parallel.ep=4"}, kFourDp)},
      // ep covers every data-parallel rank: each rank's experts are its own, unsharded.
      {"ep2_fsdp", 2, with({fsdp, "parallel.ep=2"}, kTwoDp)},
      // Four data-parallel ranks, two expert-parallel groups: each expert sharded over 2.
      {"ep2_fsdp4", 4, with({fsdp, "parallel.ep=2"}, kFourDp)},
      {"ep4_fsdp", 4, with({fsdp, "parallel.ep=4"}, kFourDp)},
      {"ep2_zero2", 4,
       with({"parallel.strategy=\"zero\"", "parallel.zero.stage=2", "parallel.ep=2"}, kFourDp)},
      {"ep2_ddp4", 4, with({ddp, "parallel.ep=2"}, kFourDp)},
      // Two replicas of two shards: the experts, one rank per replica holding them, replicated.
      {"ep2_hsdp", 4,
       with({fsdp, "parallel.fsdp.sharding=\"hybrid_shard\"", "parallel.fsdp.replicate=2",
             "parallel.ep=2"},
            kFourDp)},
      {"ep2_tp2", 4, with({ddp, "parallel.ep=2", "parallel.tp=2"}, kTwoDp)},
      {"ep4_tp2_fsdp", 8, with({fsdp, "parallel.ep=4", "parallel.tp=2"}, kFourDp)},
      {"ep2_pp2", 4, {ddp, "parallel.ep=2", "parallel.pp=2", "train.micro_batch=1"}},
  };
  for (const Layout& layout : layouts) {
    SCOPED_TRACE(layout.name);
    const RankRun got = testing::run_moe(layout.world, config(layout, layout.name), 10);
    testing::expect_same_losses(got.losses(), want.losses(), 1e-5);
    expect_same_routing(got, want);
    testing::expect_same_parameters(got.checkpoint, want.checkpoint);
  }
}

TEST_P(ExpertParallelTrainerTest, ACheckpointResumesAtAnotherEp) {
  const RankRun whole = testing::run_moe(1, config(Layout{"one", 1, {}}, "whole"), 6);
  const Layout ep2{"ep2", 2, with({"parallel.strategy=\"fsdp\"", "parallel.ep=2"}, kTwoDp)};
  const RankRun first = testing::run_moe(2, config(ep2, "first"), 3);
  // Every expert is in the checkpoint, whichever rank wrote it.
  const ShardedCheckpointReader saved(first.checkpoint);
  for (int e = 0; e < 4; ++e) {
    EXPECT_NE(saved.find("blocks.1.moe.experts." + std::to_string(e) + ".down.weight"), nullptr);
    EXPECT_NE(saved.find("optim.blocks.0.moe.experts." + std::to_string(e) + ".up.weight.exp_avg"),
              nullptr);
  }
  const std::string resume = "run.resume=\"" + first.checkpoint + "\"";
  const std::vector<Layout> next = {
      {"ep4", 4, with({"parallel.strategy=\"ddp\"", "parallel.ep=4"}, kFourDp)},
      {"ep1", 1, {}},
  };
  for (const Layout& layout : next) {
    SCOPED_TRACE(layout.name);
    const RankRun rest = testing::run_moe(layout.world, config(layout, layout.name, {resume}), 3);
    testing::expect_same_losses(
        rest.losses(), {whole.steps[3].loss, whole.steps[4].loss, whole.steps[5].loss}, 1e-5);
    testing::expect_same_parameters(rest.checkpoint, whole.checkpoint);
  }
}

TEST_P(ExpertParallelTrainerTest, RefusesWhatCannotSplit) {
  const std::string ddp = "parallel.strategy=\"ddp\"";
  testing::expect_refused(
      2,
      [&] {
        return config(Layout{"odd", 2, {ddp, "parallel.ep=3"}}, "odd");
      },
      "model.n_experts 4 is not divisible by parallel.ep = 3");
  testing::expect_refused(
      2,
      [&] {
        return config(Layout{"wide", 2, {ddp, "parallel.ep=4"}}, "wide");
      },
      "parallel.ep=4 does not divide the 2 data-parallel rank(s) of dp_shard");
  testing::expect_refused(
      4,
      [&] {
        return config(Layout{"tp", 4, {ddp, "parallel.ep=4", "parallel.tp=2"}}, "tp");
      },
      "parallel.ep=4 does not divide the 2 data-parallel rank(s) of dp_shard");
  testing::expect_refused(
      2,
      [&] {
        return config(Layout{"k", 2, {ddp, "parallel.ep=2", "model.experts_per_token=5"}}, "k");
      },
      "experts_per_token 5 exceeds n_experts 4");
  testing::expect_refused(
      2,
      [&] {
        return config(Layout{"dense", 2, {ddp, "parallel.ep=2", "model.preset=\"tiny-llama\""}},
                      "dense");
      },
      "but model.n_experts is 0");
  testing::expect_refused(
      2,
      [&] {
        return config(Layout{"lora", 2, {ddp, "parallel.ep=2", "lora.rank=4"}}, "lora");
      },
      "lora.rank > 0 with parallel.ep > 1");
  testing::expect_refused(
      4,
      [&] {
        return config(Layout{"sp", 4, {ddp, "parallel.tp=2", "parallel.sequence_parallel=true"}},
                      "sp");
      },
      "parallel.sequence_parallel with a mixture-of-experts model");
  for (const char* run : {"odd", "wide", "tp", "dense", "lora", "sp"}) {
    EXPECT_FALSE(fs::exists(dir_ / run / "metrics.jsonl")) << run;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ExpertParallelTrainerTest,
                         ::testing::Values("tiny-moe", "tiny-qwen3-moe"),
                         testing::preset_test_name);

}  // namespace ep_trainer_test
}  // namespace shardtrain
