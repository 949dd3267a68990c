// The trainer with tensor parallelism: tp alone and tp x dp under ddp, fsdp full_shard and
// ZeRO-3 train as one process does on the same global batch, write checkpoints of whole tensors
// that resume at other tensor-parallel sizes, and refuse what does not divide.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "shardtrain/rendezvous.h"
#include "shardtrain/train.h"
#include "support.h"
#include "train/local_training.h"
#include "train/run_config.h"

namespace shardtrain {
namespace tp_trainer_test {

namespace fs = std::filesystem;

constexpr int kGlobalBatch = 8;

struct Layout {
  std::string name;
  int world;
  std::vector<std::string> keys;
};

class TensorParallelTrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::fresh_test_dir("shardtrain_tp");
    std::ofstream corpus(dir_ / "corpus.txt");
    for (int i = 0; i < 300; ++i) {
      corpus << "pack my box with five dozen liquor jugs " << i % 11 << ", number " << i % 13
             << ".\n";
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The tiny model with a vocabulary that divides by 4 (the byte tokenizer has 257 ids).
  TrainConfig config(const Layout& layout, const fs::path& run, int steps,
                     const std::vector<std::string>& more = {}) const {
    const int tp_size = tp_of(layout);
    std::vector<std::string> all = {
        "model.vocab_size=260", "data.seq_len=16",
        "train.micro_batch=" + std::to_string(kGlobalBatch * tp_size / layout.world),
        "train.steps=" + std::to_string(steps), "train.lr=3e-3", "train.clip=0.5",
        // The key bias's gradient is zero in exact arithmetic and rounding noise in floating
        // point, which Adam with eps = 1e-8 turns into steps of size lr whose sign depends on
        // summation order: a larger eps keeps those elements comparable across layouts.
        "train.eps=1e-6"};
    all.insert(all.end(), layout.keys.begin(), layout.keys.end());
    all.insert(all.end(), more.begin(), more.end());
    TrainConfig cfg = testing::tiny_run_config(dir_ / "corpus.txt", run, all);
    if (preset_ == "tiny") return cfg;
    // The same run of the Llama family's tiny model.
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
                            std::string* saved = nullptr) {
    return testing::train_on_ranks(layout.world, cfg, steps, saved);
  }

  // Ten steps of each layout against one process: the same losses, and the same whole tensors
  // in the checkpoint written after them.
  void expect_as_one_process(const std::vector<Layout>& layouts) {
    const Layout one{"one", 1, {}};
    std::string want_dir;
    const auto want = train(one, config(one, dir_ / "one", 10), 10, &want_dir);
    for (const Layout& layout : layouts) {
      SCOPED_TRACE(layout.name);
      std::string got_dir;
      const auto got = train(layout, config(layout, dir_ / layout.name, 10), 10, &got_dir);
      testing::expect_same_losses(got, want, 1e-5);
      testing::expect_same_parameters(got_dir, want_dir);
    }
  }

  fs::path dir_;
  std::string preset_ = "tiny";
};

TEST_F(TensorParallelTrainerTest, EveryLayoutTrainsAsOneProcess) {
  expect_as_one_process(
      {Layout{"tp2", 2, {"parallel.tp=2", "parallel.sequence_parallel=true"}},
       Layout{"tp4", 4, {"parallel.tp=4", "train.activation_checkpointing=true"}},
       Layout{"tp2_ddp2", 4, {"parallel.tp=2", "parallel.strategy=\"ddp\""}},
       Layout{"tp2_fsdp2",
              4,
              {"parallel.tp=2", "parallel.strategy=\"fsdp\"", "parallel.sequence_parallel=true"}},
       Layout{"tp2_zero3",
              4,
              {"parallel.tp=2", "parallel.strategy=\"zero\"", "parallel.zero.stage=3"}},
       Layout{"tp2_zero1",
              4,
              {"parallel.tp=2", "parallel.strategy=\"zero\"", "parallel.zero.stage=1"}},
       Layout{"tp2_shard_grad_op",
              4,
              {"parallel.tp=2", "parallel.strategy=\"fsdp\"",
               "parallel.fsdp.sharding=\"shard_grad_op\""}},
       Layout{
           "tp2_no_shard",
           4,
           {"parallel.tp=2", "parallel.strategy=\"fsdp\"", "parallel.fsdp.sharding=\"no_shard\""}},
       // 8 ranks: 2 replicas x 2 shards x tp 2.
       Layout{"tp2_hybrid_shard",
              8,
              {"parallel.tp=2", "parallel.strategy=\"fsdp\"",
               "parallel.fsdp.sharding=\"hybrid_shard\"", "parallel.fsdp.replicate=2"}}});
}

// Grouped-query attention (2 key/value heads for 4 query heads): each of tp = 2 ranks keeps one
// key/value head and the two query heads that read it.
TEST_F(TensorParallelTrainerTest, LlamaTrainsAsOneProcess) {
  preset_ = "tiny-llama";
  expect_as_one_process(
      {Layout{"tp2", 2, {"parallel.tp=2", "parallel.sequence_parallel=true"}},
       Layout{"tp2_ckpt", 2, {"parallel.tp=2", "train.activation_checkpointing=true"}},
       Layout{"tp2_ddp2", 4, {"parallel.tp=2", "parallel.strategy=\"ddp\""}},
       Layout{"tp2_fsdp2",
              4,
              {"parallel.tp=2", "parallel.strategy=\"fsdp\"", "parallel.sequence_parallel=true"}},
       Layout{"tp2_zero3",
              4,
              {"parallel.tp=2", "parallel.strategy=\"zero\"", "parallel.zero.stage=3"}}});
}

TEST_F(TensorParallelTrainerTest, CheckpointsResumeAtOtherTensorParallelSizes) {
  const Layout one{"one", 1, {}};
  const auto want = train(one, config(one, dir_ / "one", 8), 8);
  const Layout saver{"tp2_ddp2", 4, {"parallel.tp=2", "parallel.strategy=\"ddp\""}};
  std::string saved;
  const auto first = train(saver, config(saver, dir_ / "saved", 8), 4, &saved);
  testing::expect_same_losses(first, {want.begin(), want.begin() + 4}, 1e-5);
  for (const Layout& layout :
       {Layout{"tp1_ddp4", 4, {"parallel.strategy=\"ddp\""}}, Layout{"tp4", 4, {"parallel.tp=4"}},
        Layout{"tp2_fsdp2", 4, {"parallel.tp=2", "parallel.strategy=\"fsdp\""}}}) {
    SCOPED_TRACE(layout.name);
    const auto rest =
        train(layout, config(layout, dir_ / layout.name, 8, {"run.resume=\"" + saved + "\""}), 4);
    testing::expect_same_losses(rest, {want.begin() + 4, want.end()}, 1e-5);
  }
}

TEST_F(TensorParallelTrainerTest, RefusesWhatDoesNotDivide) {
  auto refused = [&](int world, const std::vector<std::string>& keys, const std::string& words) {
    const Layout layout{"bad", world, keys};
    testing::expect_refused(
        world, [&] { return config(layout, dir_ / "bad", 1); }, words);
  };
  refused(2, {"parallel.tp=4"}, "world size 2 is not divisible by parallel.tp=4");
  refused(2, {"parallel.tp=2", "model.vocab_size=257"},
          "model.vocab_size (257) is not divisible by parallel.tp=2");
  refused(2, {"parallel.tp=2", "model.ffn_hidden=129"}, "model.ffn_hidden (129)");
  refused(2, {"parallel.tp=2", "model.n_kv_heads=1", "model.n_heads=1"}, "model.n_heads (1)");
  refused(2, {"parallel.tp=2", "model.dropout=0.1"}, "model.dropout > 0 with parallel.tp > 1");
  refused(2, {"parallel.tp=2", "parallel.sequence_parallel=true", "data.seq_len=15"},
          "data.seq_len 15 is not divisible by parallel.tp=2");
}

}  // namespace tp_trainer_test
}  // namespace shardtrain
