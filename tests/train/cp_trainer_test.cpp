// The trainer with context parallelism: each sequence split over cp ranks (two load-balanced
// chunks each, attention by ring), alone, with ddp, fsdp and ZeRO over dp_shard x cp, and with
// tensor parallelism (and sequence parallelism) inside, trains
// as one process does on the same global batch for both model families, evaluates the same,
// writes checkpoints that resume at another cp, and refuses what it cannot split.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "plan/run_estimate.h"
#include "shardtrain/plan.h"
#include "shardtrain/train.h"
#include "support.h"
#include "train/local_training.h"
#include "train/memory_check.h"
#include "train/run_config.h"
#include "train/run_manifest.h"

namespace shardtrain {
namespace cp_trainer_test {

namespace fs = std::filesystem;

constexpr int kGlobalBatch = 8;

struct Layout {
  std::string name;
  int world;
  int cp;
  std::vector<std::string> keys;
};

class ContextParallelTrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::fresh_test_dir("shardtrain_cp");
    std::ofstream corpus(dir_ / "corpus.txt");
    for (int i = 0; i < 300; ++i) {
      corpus << "pack my box with five dozen liquor jugs " << i % 11 << ", number " << i % 13
             << ".\n";
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  TrainConfig config(const Layout& layout, const fs::path& run, int steps,
                     const std::vector<std::string>& more = {}) const {
    std::vector<std::string> all = {
        "model.vocab_size=260",
        "data.seq_len=16",
        "train.steps=" + std::to_string(steps),
        "train.micro_batch=" +
            std::to_string(kGlobalBatch * layout.cp * tp_of(layout) / layout.world),
        "train.lr=3e-3",
        "train.clip=0.5",
        "train.eps=1e-6",
        "parallel.cp=" + std::to_string(layout.cp)};
    all.insert(all.end(), layout.keys.begin(), layout.keys.end());
    all.insert(all.end(), more.begin(), more.end());
    TrainConfig cfg = testing::tiny_run_config(dir_ / "corpus.txt", run, all);
    if (preset_ == "tiny") return cfg;
    const TrainConfig other = parse_train_config("[model]\npreset = \"" + preset_ + "\"\n",
                                                 "test.toml", {"model.vocab_size=260"});
    cfg.model = other.model;
    cfg.validate();
    return cfg;
  }

  static int tp_of(const Layout& layout) {
    return testing::setting_in(layout.keys, "parallel.tp", 1);
  }

  std::vector<double> train(const Layout& layout, const TrainConfig& cfg, int steps,
                            std::string* saved = nullptr, double* eval = nullptr) {
    return testing::train_on_ranks(layout.world, cfg, steps, saved, eval);
  }

  // Ten steps of each layout against one process: the same losses, evaluation and parameters.
  void expect_as_one_process(const std::vector<Layout>& layouts) {
    const Layout one{"one", 1, 1, {}};
    std::string want_dir;
    double want_eval = 0.0;
    const auto want = train(one, config(one, dir_ / "one", 10), 10, &want_dir, &want_eval);
    for (const Layout& layout : layouts) {
      SCOPED_TRACE(layout.name);
      std::string got_dir;
      double got_eval = 0.0;
      const auto got =
          train(layout, config(layout, dir_ / layout.name, 10), 10, &got_dir, &got_eval);
      testing::expect_same_losses(got, want, 1e-5);
      // Evaluation takes micro-batches of rows; with the whole batch on each data-parallel rank
      // (dp = 1) they are the same rows as one process's.
      if (layout.world == layout.cp * tp_of(layout)) {
        EXPECT_NEAR(got_eval, want_eval, 1e-5 * want_eval);
      }
      testing::expect_same_parameters(got_dir, want_dir);
    }
  }

  fs::path dir_;
  std::string preset_ = "tiny";
};

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      Layout{"cp2", 2, 2, {"parallel.strategy=\"ddp\""}},
      Layout{"cp4", 4, 4, {"parallel.strategy=\"ddp\""}},
      Layout{
          "cp2_ckpt", 2, 2, {"parallel.strategy=\"ddp\"", "train.activation_checkpointing=true"}},
      Layout{"cp2_dp2", 4, 2, {"parallel.strategy=\"ddp\""}},
      Layout{"cp2_fsdp2", 4, 2, {"parallel.strategy=\"fsdp\""}},
      Layout{"cp2_zero3", 2, 2, {"parallel.strategy=\"zero\"", "parallel.zero.stage=3"}},
      Layout{"cp2_tp2", 4, 2, {"parallel.strategy=\"ddp\"", "parallel.tp=2"}},
      Layout{"cp2_pp2", 4, 2, {"parallel.strategy=\"ddp\"", "parallel.pp=2", "train.grad_accum=2"}},
      Layout{"cp4_fsdp", 4, 4, {"parallel.strategy=\"fsdp\""}},
      Layout{"cp4_tp2", 8, 4, {"parallel.strategy=\"ddp\"", "parallel.tp=2"}},
      Layout{"cp4_pp2", 8, 4, {"parallel.strategy=\"ddp\"", "parallel.pp=2", "train.grad_accum=2"}},
      Layout{"cp2_tp2_fsdp",
             4,
             2,
             {"parallel.strategy=\"fsdp\"", "parallel.tp=2", "parallel.sequence_parallel=true"}}};
  return all;
}

TEST_F(ContextParallelTrainerTest, Gpt2TrainsAsOneProcess) { expect_as_one_process(layouts()); }

TEST_F(ContextParallelTrainerTest, LlamaTrainsAsOneProcess) {
  preset_ = "tiny-llama";  // RoPE and grouped-query attention (2 key/value heads for 4)
  expect_as_one_process(layouts());
}

TEST_F(ContextParallelTrainerTest, CheckpointsResumeAtAnotherContextParallelSize) {
  const Layout one{"one", 1, 1, {}};
  const auto want = train(one, config(one, dir_ / "one", 8), 8);
  const Layout saver{"cp2", 2, 2, {"parallel.strategy=\"ddp\""}};
  std::string saved;
  const auto first = train(saver, config(saver, dir_ / "saved", 8), 4, &saved);
  testing::expect_same_losses(first, {want.begin(), want.begin() + 4}, 1e-5);
  for (const Layout& layout : {Layout{"cp4", 4, 4, {"parallel.strategy=\"fsdp\""}},
                               Layout{"cp1_ddp2", 2, 1, {"parallel.strategy=\"ddp\""}}}) {
    SCOPED_TRACE(layout.name);
    const auto rest =
        train(layout, config(layout, dir_ / layout.name, 8, {"run.resume=\"" + saved + "\""}), 4);
    testing::expect_same_losses(rest, {want.begin() + 4, want.end()}, 1e-5);
  }
}

TEST_F(ContextParallelTrainerTest, RefusesWhatItCannotSplit) {
  auto refused = [&](int world, int cp, const std::vector<std::string>& keys,
                     const std::string& words) {
    const Layout layout{"bad", world, cp, keys};
    testing::expect_refused(
        world, [&] { return config(layout, dir_ / "bad", 1); }, words);
  };
  const std::string ddp = "parallel.strategy=\"ddp\"";
  refused(2, 2, {ddp, "data.seq_len=14"},
          "data.seq_len 14 is not divisible by 2 x parallel.cp = 4");
  refused(3, 2, {ddp}, "world size 3 is not divisible by parallel.cp=2");
  refused(2, 2, {ddp, "model.dropout=0.1"}, "parallel.cp > 1 needs model.dropout = 0");
  refused(2, 2, {ddp, "train.attention=\"fused\""},
          "parallel.cp > 1 splits attention with the blockwise kernel");
  refused(2, 2, {}, "parallel.cp > 1 needs parallel.strategy");
  EXPECT_FALSE(fs::exists(dir_ / "bad"));  // refused before the run directory was made
}

// A length whose activations do not fit at cp = 1 under any sharding of the model's state is
// refused before the run, the message naming context parallelism; at cp = 4 it passes the
// check. The budget lies between the planner's estimates of the two runs.
TEST_F(ContextParallelTrainerTest, TheMemoryCheckNamesContextParallelismForALongSequence) {
  const std::vector<std::string> long_run = {"model.context_length=16384", "data.seq_len=16384",
                                             "train.micro_batch=1", "parallel.strategy=\"fsdp\""};
  auto with_cp = [&](int cp) {
    std::vector<std::string> keys = long_run;
    keys.push_back("parallel.cp=" + std::to_string(cp));
    return testing::tiny_run_config(dir_ / "corpus.txt", dir_ / "long", keys);
  };
  auto estimate = [&](int cp) {
    return detail::estimate_run(detail::run_manifest(with_cp(cp), 4), hardware_spec("cpu"), "long")
        .run.memory.total();
  };
  const double at_one = estimate(1), at_four = estimate(4);
  ASSERT_LT(at_four, 0.5 * at_one);  // the activations dominate, and cp divides them
  const detail::MemoryBudget budget{static_cast<int64_t>((at_one + at_four) / 2), "a test budget"};
  try {
    detail::check_memory_fits(with_cp(1), 4, budget, 0);
    ADD_FAILURE() << "cp = 1 passed the memory check";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.cp = "), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(detail::check_memory_fits(with_cp(4), 4, budget, 0));
}

}  // namespace cp_trainer_test
}  // namespace shardtrain
