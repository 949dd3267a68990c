// The trainer with pipeline parallelism: every schedule at pp = 2 and 4 (interleaved with two
// virtual stages), uneven splits, tied embeddings, activation checkpointing, pp x dp (ddp,
// fsdp, zero 1) and pp x tp x dp train as one process does on the same global batch and
// micro-batches, write checkpoints that resume at other pipeline sizes, and refuse what does not
// fit.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include "parallel/parallelize.h"
#include "shardtrain/rendezvous.h"
#include "shardtrain/sharded_checkpoint.h"
#include "shardtrain/train.h"
#include "support.h"
#include "train/local_training.h"
#include "train/run_config.h"

namespace shardtrain {
namespace pp_trainer_test {

namespace fs = std::filesystem;

constexpr int kGlobalBatch = 8;
constexpr int kMicroBatches = 4;

struct Layout {
  std::string name;
  int world;
  std::vector<std::string> keys;
  int dp = 1;  // data-parallel ranks: the micro-batch is split among them
};

class PipelineTrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::fresh_test_dir("shardtrain_pp");
    std::ofstream corpus(dir_ / "corpus.txt");
    for (int i = 0; i < 300; ++i) {
      corpus << "sphinx of black quartz, judge my vow " << i % 11 << ", number " << i % 13 << ".\n";
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The tiny model (tied embeddings) with `blocks_` blocks and a vocabulary that divides by 2.
  TrainConfig config(const Layout& layout, const fs::path& run, int steps,
                     const std::vector<std::string>& more = {}) const {
    std::vector<std::string> all = {
        "model.vocab_size=260", "model.n_layers=" + std::to_string(blocks_), "data.seq_len=16",
        "train.grad_accum=" + std::to_string(kMicroBatches),
        "train.micro_batch=" + std::to_string(kGlobalBatch / kMicroBatches / layout.dp),
        "train.steps=" + std::to_string(steps), "train.lr=3e-3", "train.clip=0.5",
        // As in the tensor-parallel tests: near-zero gradients (the key bias) take steps of
        // size lr under eps = 1e-8 whose sign depends on summation order.
        "train.eps=1e-6", "data.eval_sequences=4", "train.eval_batches=2"};
    all.insert(all.end(), layout.keys.begin(), layout.keys.end());
    all.insert(all.end(), more.begin(), more.end());
    TrainConfig cfg = testing::tiny_run_config(dir_ / "corpus.txt", run, all);
    if (preset_ == "tiny") return cfg;
    // The same run of the Llama family's tiny model (untied embeddings: a head of its own).
    const TrainConfig other =
        parse_train_config("[model]\npreset = \"" + preset_ + "\"\n", "test.toml",
                           {"model.vocab_size=260", "model.n_layers=" + std::to_string(blocks_)});
    cfg.model = other.model;
    cfg.validate();
    return cfg;
  }

  std::vector<double> train(const Layout& layout, const TrainConfig& cfg, int steps,
                            std::string* saved = nullptr, double* eval = nullptr) {
    return testing::train_on_ranks(layout.world, cfg, steps, saved, eval);
  }

  // Ten steps of each layout against one process: the same losses, the same evaluation, and
  // the same whole tensors in the checkpoint written after them.
  void expect_as_one_process(const std::vector<Layout>& layouts) {
    const Layout one{"one", 1, {}};
    std::string want_dir;
    double want_eval = 0;
    const auto want = train(one, config(one, dir_ / "one", 10), 10, &want_dir, &want_eval);
    for (const Layout& layout : layouts) {
      SCOPED_TRACE(layout.name);
      std::string got_dir;
      double got_eval = 0;
      const auto got =
          train(layout, config(layout, dir_ / layout.name, 10), 10, &got_dir, &got_eval);
      testing::expect_same_losses(got, want, 1e-5);
      // Evaluation reads train.micro_batch-sized batches: comparable when that is the same.
      if (layout.dp == 1) {
        EXPECT_NEAR(got_eval, want_eval, 1e-5 * want_eval);
      }
      expect_same_tensors(got_dir, want_dir);
    }
  }

  static void expect_same_tensors(const std::string& got_dir, const std::string& want_dir) {
    const ShardedCheckpointReader got(got_dir), want(want_dir);
    ASSERT_EQ(got.tensors().size(), want.tensors().size());
    for (const auto& spec : want.tensors()) {
      ASSERT_NE(got.find(spec.name), nullptr) << spec.name;
      const at::Tensor a = got.read(spec.name).to(at::kDouble);
      const at::Tensor b = want.read(spec.name).to(at::kDouble);
      ASSERT_EQ(a.sizes(), b.sizes()) << spec.name;
      if (spec.name.rfind("optim.", 0) == 0) continue;
      EXPECT_LE((a - b).norm().item<double>(), 1e-5 * b.norm().item<double>() + 1e-7) << spec.name;
    }
  }

  fs::path dir_;
  int blocks_ = 4;
  std::string preset_ = "tiny";
};

// The last stage takes the loss over chunks of the logits (Transformer::head_loss), in one
// graph (1F1B) and from a detached copy of the last block's output (zero bubble's split
// backward): both train, and evaluate, as the whole logits of one process do.
TEST_F(PipelineTrainerTest, TheChunkedLossOnTheLastStageTrainsAsTheWholeLogits) {
  const Layout one{"one", 1, {"train.chunked_loss=false"}};
  double want_eval = 0;
  const auto want = train(one, config(one, dir_ / "whole", 6), 6, nullptr, &want_eval);
  for (const std::string schedule : {"1f1b", "zero_bubble"}) {
    SCOPED_TRACE(schedule);
    const Layout layout{schedule,
                        2,
                        {"parallel.pp=2", "parallel.pp_schedule=\"" + schedule + "\"",
                         "train.chunked_loss=true", "train.loss_chunk_tokens=7"}};
    double got_eval = 0;
    testing::expect_same_losses(
        train(layout, config(layout, dir_ / schedule, 6), 6, nullptr, &got_eval), want, 1e-5);
    EXPECT_NEAR(got_eval, want_eval, 1e-5 * want_eval);
  }
}

TEST_F(PipelineTrainerTest, EveryScheduleAtTwoStagesTrainsAsOneProcess) {
  expect_as_one_process(
      {Layout{"gpipe", 2, {"parallel.pp=2", "parallel.pp_schedule=\"gpipe\""}},
       Layout{"1f1b_uneven", 2, {"parallel.pp=2", "parallel.pp_split=[3, 1]"}},
       Layout{"interleaved",
              2,
              {"parallel.pp=2", "parallel.pp_schedule=\"interleaved_1f1b\"",
               "parallel.pp_virtual_stages=2"}},
       Layout{"zero_bubble", 2, {"parallel.pp=2", "parallel.pp_schedule=\"zero_bubble\""}},
       Layout{"zero_bubble_checkpointed",
              2,
              {"parallel.pp=2", "parallel.pp_schedule=\"zero_bubble\"",
               "train.activation_checkpointing=true", "parallel.pp_split=[1, 3]"}},
       Layout{"1f1b_dp2", 4, {"parallel.pp=2", "parallel.strategy=\"ddp\""}, 2}});
}

TEST_F(PipelineTrainerTest, EveryScheduleAtFourStagesTrainsAsOneProcess) {
  blocks_ = 8;
  expect_as_one_process({Layout{"gpipe", 4, {"parallel.pp=4", "parallel.pp_schedule=\"gpipe\""}},
                         Layout{"1f1b_checkpointed",
                                4,
                                {"parallel.pp=4", "train.activation_checkpointing=true",
                                 "parallel.pp_split=[3, 2, 2, 1]"}},
                         Layout{"interleaved",
                                4,
                                {"parallel.pp=4", "parallel.pp_schedule=\"interleaved_1f1b\"",
                                 "parallel.pp_virtual_stages=2"}},
                         Layout{"zero_bubble",
                                4,
                                {"parallel.pp=4", "parallel.pp_schedule=\"zero_bubble\"",
                                 "parallel.pp_split=[1, 2, 2, 3]"}}});
}

// 8 ranks: two pipelines of two stages, each stage split over two tensor-parallel ranks; and
// four stages of two tensor-parallel ranks, whose middle stages hold neither end.
TEST_F(PipelineTrainerTest, PipelineTimesTensorTimesDataParallelTrainsAsOneProcess) {
  expect_as_one_process({Layout{"pp2_tp2_dp2",
                                8,
                                {"parallel.pp=2", "parallel.tp=2", "parallel.strategy=\"ddp\"",
                                 "parallel.sequence_parallel=true"},
                                2},
                         Layout{"pp4_tp2", 8, {"parallel.pp=4", "parallel.tp=2"}}});
}

// FSDP and ZeRO-1 shard each stage over its data-parallel ranks: the stage stays gathered
// through the step and its gradients are reduced once, when every micro-batch is done. At
// pp = 4 the middle stages hold no parameter outside their blocks (an empty root unit), and a
// size policy no stage reaches makes each stage one unit; zero bubble's split backward runs
// without activation checkpointing (which runs whole backwards).
TEST_F(PipelineTrainerTest, PipelineTimesShardedDataParallelTrainsAsOneProcess) {
  expect_as_one_process(
      {Layout{"pp2_fsdp_dp2_checkpointed",
              4,
              {"parallel.pp=2", "parallel.strategy=\"fsdp\"", "parallel.pp_split=[3, 1]",
               "train.activation_checkpointing=true"},
              2},
       Layout{"pp2_zero1_dp2_zero_bubble",
              4,
              {"parallel.pp=2", "parallel.strategy=\"zero\"", "parallel.zero.stage=1",
               "parallel.pp_schedule=\"zero_bubble\""},
              2},
       Layout{
           "pp4_fsdp_dp2_zero_bubble",
           8,
           {"parallel.pp=4", "parallel.strategy=\"fsdp\"", "parallel.pp_schedule=\"zero_bubble\"",
            "parallel.fsdp.wrap=\"size\"", "parallel.fsdp.min_params=100000000"},
           2},
       Layout{"pp2_tp2_zero1_dp2_sequence_parallel",
              8,
              {"parallel.pp=2", "parallel.tp=2", "parallel.strategy=\"zero\"",
               "parallel.zero.stage=1", "parallel.sequence_parallel=true"},
              2},
       Layout{"pp2_tp2_fsdp_dp2",
              8,
              {"parallel.pp=2", "parallel.tp=2", "parallel.strategy=\"fsdp\"",
               "parallel.pp_schedule=\"gpipe\""},
              2},
       // The same global batch as two micro-batches of one sequence on each of four ranks.
       Layout{"pp2_hybrid_shard_2x2",
              8,
              {"parallel.pp=2", "parallel.strategy=\"fsdp\"",
               "parallel.fsdp.sharding=\"hybrid_shard\"", "parallel.fsdp.replicate=2",
               "train.grad_accum=2", "train.micro_batch=1"},
              4}});
}

// Untied embeddings (Llama): the first stage holds the embedding, the last its own head.
TEST_F(PipelineTrainerTest, LlamaPipelineTimesTensorTrainsAsOneProcess) {
  preset_ = "tiny-llama";
  blocks_ = 8;
  expect_as_one_process(
      {Layout{"pp2_tp2",
              4,
              {"parallel.pp=2", "parallel.tp=2", "parallel.sequence_parallel=true",
               "parallel.pp_schedule=\"zero_bubble\""}},
       Layout{"pp4",
              4,
              {"parallel.pp=4", "parallel.pp_schedule=\"interleaved_1f1b\"",
               "parallel.pp_virtual_stages=2"}}});
}

// With three data-parallel ranks each stage's all-reduce adds in its own order (under ZeRO-1
// over flat buffers that differ between the stages): the two copies of the tied embedding must
// still be the same bits after every step.
TEST_F(PipelineTrainerTest, TiedEmbeddingCopiesStayIdenticalAcrossThreeReplicas) {
  for (const std::string strategy : {"ddp", "zero"}) {
    SCOPED_TRACE(strategy);
    const Layout layout{
        "pp2_dp3", 6, {"parallel.pp=2", "parallel.strategy=\"" + strategy + "\""}, 1};
    TrainConfig cfg = config(layout, dir_ / ("tied_" + strategy), 4, {"train.micro_batch=1"});
    std::mutex mutex;
    std::map<int, at::Tensor> first, last;  // by data-parallel rank
    run_local_ranks(6, [&](ProcessGroup& group) {
      Trainer trainer(cfg, std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {}));
      for (int i = 0; i < 4; ++i) trainer.train_step();
      // ZeRO-1 keeps the whole parameters, gathered after each step: evaluation waits for that.
      trainer.evaluate();
      const at::Tensor weight =
          trainer.model()->named_parameters()["tok_emb.weight"].detach().clone();
      std::lock_guard<std::mutex> lock(mutex);
      (trainer.pp_rank() == 0 ? first : last)[trainer.dp_rank()] = weight;
    });
    ASSERT_EQ(first.size(), 3u);
    ASSERT_EQ(last.size(), 3u);
    for (int dp = 0; dp < 3; ++dp) {
      EXPECT_TRUE(at::equal(first[dp], last[dp])) << "replica " << dp;
      EXPECT_TRUE(at::equal(first[dp], first[0])) << "replica " << dp;
    }
  }
}

TEST_F(PipelineTrainerTest, CheckpointsResumeAtOtherPipelineSizes) {
  const Layout one{"one", 1, {}};
  const auto want = train(one, config(one, dir_ / "one", 8), 8);
  const Layout saver{"pp2", 2, {"parallel.pp=2", "parallel.pp_split=[3, 1]"}};
  std::string saved;
  const auto first = train(saver, config(saver, dir_ / "saved", 8), 4, &saved);
  testing::expect_same_losses(first, {want.begin(), want.begin() + 4}, 1e-5);
  for (const Layout& layout :
       {Layout{"pp1", 1, {}}, Layout{"pp4", 4, {"parallel.pp=4"}},
        Layout{"pp2_dp2", 4, {"parallel.pp=2", "parallel.strategy=\"ddp\""}, 2},
        Layout{"pp2_fsdp_dp2", 4, {"parallel.pp=2", "parallel.strategy=\"fsdp\""}, 2}}) {
    SCOPED_TRACE(layout.name);
    const auto rest =
        train(layout, config(layout, dir_ / layout.name, 8, {"run.resume=\"" + saved + "\""}), 4);
    testing::expect_same_losses(rest, {want.begin() + 4, want.end()}, 1e-5);
  }
}

// hybrid_shard without parallel.fsdp.replicate takes one replica per node of a stage: pipeline
// stages are the mesh's outermost axis, so a stage spans nodes / pp nodes.
TEST_F(PipelineTrainerTest, HybridShardFindsEachStagesNodes) {
  const Layout layout{"hybrid",
                      8,
                      {"parallel.pp=2", "parallel.strategy=\"fsdp\"",
                       "parallel.fsdp.sharding=\"hybrid_shard\"", "parallel.fsdp.replicate=0"}};
  const TrainConfig cfg = config(layout, dir_ / "hybrid", 1);
  const MeshShape shape = train_mesh_shape(cfg, 8, /*ranks_per_node=*/2);  // 4 nodes
  EXPECT_EQ(shape.degree(MeshAxis::kPp), 2);
  EXPECT_EQ(shape.degree(MeshAxis::kDpReplicate), 2);
  EXPECT_EQ(shape.degree(MeshAxis::kDpShard), 2);
  try {
    train_mesh_shape(cfg, 8, /*ranks_per_node=*/4);  // 2 nodes: each stage on one
    ADD_FAILURE() << "a stage on one node was given replicas";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("when the ranks of a pipeline stage are not on several "
                                         "nodes"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(PipelineTrainerTest, RefusesWhatDoesNotFit) {
  auto refused = [&](int world, const std::vector<std::string>& keys, const std::string& words) {
    const Layout layout{"bad", world, keys};
    testing::expect_refused(
        world, [&] { return config(layout, dir_ / "bad", 1); }, words);
  };
  refused(3, {"parallel.pp=2", "parallel.strategy=\"ddp\""},
          "world size 3 is not divisible by parallel.pp=2");
  refused(2, {"parallel.pp=2", "model.n_layers=1"},
          "the pipeline has 2 stages (parallel.pp x parallel.pp_virtual_stages) but the model has "
          "only 1 blocks");
  refused(4, {"parallel.pp=4", "train.grad_accum=2"},
          "parallel.pp_schedule = \"1f1b\" needs at least one micro-batch per stage");
  refused(2,
          {"parallel.pp=2", "model.n_layers=3", "parallel.pp_schedule=\"interleaved_1f1b\"",
           "parallel.pp_virtual_stages=2"},
          "the model's 3 blocks do not divide into parallel.pp x parallel.pp_virtual_stages = 4 "
          "stages");
  refused(
      2, {"parallel.pp=2", "parallel.strategy=\"zero\"", "parallel.zero.stage=2"},
      "parallel.pp > 1 with parallel.zero.stage = 2: pipeline stages combine with ZeRO stage 1");
  refused(2, {"parallel.pp=2", "parallel.strategy=\"fsdp\"", "precision.param_dtype=\"bf16\""},
          "precision.param_dtype = \"bf16\" with parallel.pp > 1");
  refused(2,
          {"parallel.pp=2", "parallel.strategy=\"zero\"", "parallel.zero.stage=1",
           "parallel.zero.offload_optimizer=\"cpu\""},
          "offload is not combined with pipeline stages");
  refused(1, {"parallel.pp_virtual_stages=2"},
          "parallel.pp_split and parallel.pp_virtual_stages need parallel.pp > 1");
}

}  // namespace pp_trainer_test
}  // namespace shardtrain
