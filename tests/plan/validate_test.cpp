// `plan --validate`: run.json and metrics.jsonl of a run against the estimate.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "shardtrain/plan.h"
#include "shardtrain/train.h"
#include "support.h"

namespace shardtrain {
namespace validate_test {

namespace fs = std::filesystem;
using nlohmann::json;

json run_json(int world, const json& parallel) {
  const ModelConfig m = model_preset("tiny");
  return {{"world_size", world},
          {"model",
           {{"family", "gpt2"},
            {"vocab_size", m.vocab_size},
            {"context_length", m.context_length},
            {"d_model", m.d_model},
            {"n_layers", m.n_layers},
            {"n_heads", m.n_heads},
            {"n_kv_heads", m.n_kv_heads},
            {"ffn_hidden", m.ffn_hidden},
            {"tie_embeddings", true}}},
          {"train", {{"micro_batch", 4}, {"grad_accum", 1}, {"seq_len", 32}, {"threads", 1}}},
          {"parallel", parallel},
          {"precision", {{"autocast", "none"}}}};
}

void write_run(const fs::path& dir, const json& run, double state_bytes, int world) {
  fs::create_directories(dir);
  std::ofstream(dir / "run.json") << run.dump();
  std::ofstream metrics(dir / "metrics.jsonl");
  for (int step = 1; step <= 5; ++step) {
    for (int rank = 0; rank < world; ++rank) {
      // Step 1 (warm-up) is slow and is left out of the median.
      metrics << json{{"step", step},
                      {"rank", rank},
                      {"step_time_s", step == 1 ? 9.0 : 0.01 * step},
                      {"mem",
                       {{"params", state_bytes / 4},
                        {"grads", state_bytes / 4},
                        {"optim", state_bytes / 2},
                        {"peak_rss", 1e8 + 1e6 * step + rank}}}}
                     .dump()
              << "\n";
    }
  }
}

TEST(PlanValidate, ReadsTheRunAndComparesMedians) {
  const fs::path dir = testing::fresh_test_dir("shardtrain_plan_validate");
  const double P = static_cast<double>(model_preset("tiny").num_parameters());
  write_run(dir / "ddp", run_json(2, {{"strategy", "ddp"}}), 16 * P, 2);
  const ValidationResult r = validate_run((dir / "ddp").string(), hardware_spec("cpu"));
  EXPECT_EQ(r.world_size, 2);
  EXPECT_EQ(r.steps, 4);
  EXPECT_EQ(r.strategy, "DDP");
  // fp32 parameters, gradients and two Adam moments: 16 bytes per parameter on every rank.
  EXPECT_DOUBLE_EQ(r.estimated_model_states, 16 * P);
  EXPECT_NEAR(r.model_state_error(), 0.0, 1e-12);
  EXPECT_DOUBLE_EQ(r.measured_step_time, 0.035);  // median of 0.02, 0.03, 0.04, 0.05
  EXPECT_GT(r.estimated_step_time, 0.0);
  EXPECT_TRUE(format_validation(r).find("error +0.0%") != std::string::npos)
      << format_validation(r);
  // Peak memory: the largest rank's peak RSS, against the planner's total plus what the process
  // held at start (when run.json records it).
  EXPECT_DOUBLE_EQ(r.measured_peak_rss, 1e8 + 5e6 + 1);
  json with_start = run_json(2, {{"strategy", "ddp"}});
  with_start["process"] = {{"resident_at_start", 5e7}};
  write_run(dir / "ddp_start", with_start, 16 * P, 2);
  const ValidationResult started = validate_run((dir / "ddp_start").string(), hardware_spec("cpu"));
  EXPECT_DOUBLE_EQ(started.estimated_peak, r.estimated_peak + 5e7);
  EXPECT_GT(r.estimated_peak, 16 * P);  // model states, plus activations
  EXPECT_NE(format_validation(r).find("peak memory per rank"), std::string::npos);
  fs::remove_all(dir);
}

// Under a pipeline a rank holds one stage: n_layers / pp blocks and one of the embedding and
// the head. FSDP, which holds its stage whole through the step beside its shards, is estimated
// as DDP (an upper bound); an uneven split as the whole model.
TEST(PlanValidate, PipelineRunsAreEstimatedPerStage) {
  const fs::path dir = testing::fresh_test_dir("shardtrain_plan_validate_pp");
  const ModelConfig m = model_preset("tiny");
  int64_t block = 0;
  for (const auto& p : m.parameter_shapes()) {
    if (p.name.rfind("blocks.0.", 0) == 0) block += p.numel();
  }
  const double stage = static_cast<double>(m.n_layers / 2 * block + m.vocab_size * m.d_model);
  struct Case {
    json parallel;
    int64_t n_layers;
    double states;
  };
  // Three blocks do not split evenly in two: the whole model, with its third block.
  const double whole_of_three = static_cast<double>(m.num_parameters() + block);
  const Case cases[] = {
      {{{"strategy", "ddp"}, {"pp", 2}}, m.n_layers, 16 * stage},
      {{{"strategy", "fsdp"}, {"pp", 2}, {"fsdp", {{"sharding", "full_shard"}}}},
       m.n_layers,
       16 * stage},
      {{{"strategy", "ddp"}, {"pp", 2}, {"pp_split", {1, 1}}}, m.n_layers, 16 * stage},
      {{{"strategy", "fsdp"}, {"pp", 2}}, 3, 16 * whole_of_three},
  };
  for (const auto& c : cases) {
    json run = run_json(4, c.parallel);
    run["model"]["n_layers"] = c.n_layers;
    write_run(dir / "run", run, c.states, 4);
    const ValidationResult r = validate_run((dir / "run").string(), hardware_spec("cpu"));
    EXPECT_EQ(r.strategy, "DDP");
    EXPECT_NEAR(r.estimated_model_states, c.states, 1e-6) << c.parallel.dump();
  }
  // ZeRO-1 shards the stage's optimizer state over its two data-parallel ranks.
  write_run(dir / "run", run_json(4, {{"strategy", "zero"}, {"pp", 2}, {"zero", {{"stage", 1}}}}),
            1, 4);
  const ValidationResult zero1 = validate_run((dir / "run").string(), hardware_spec("cpu"));
  EXPECT_EQ(zero1.strategy, "ZeRO-1");
  EXPECT_LT(zero1.estimated_model_states, 16 * stage);
  EXPECT_GT(zero1.estimated_model_states, 8 * stage);
  fs::remove_all(dir);
}

TEST(PlanValidate, ShardedStrategiesMapToTheirCandidates) {
  const fs::path dir = testing::fresh_test_dir("shardtrain_plan_validate");
  const ModelConfig m = model_preset("tiny");
  // Flat parameters per block and for the rest, each padded to a multiple of the 4 ranks.
  int64_t block = 0;
  for (const auto& p : m.parameter_shapes()) {
    if (p.name.rfind("blocks.0.", 0) == 0) block += p.numel();
  }
  const int64_t root = m.num_parameters() - m.n_layers * block;
  const double shard = m.n_layers * std::ceil(block / 4.0) + std::ceil(root / 4.0);
  const double P = static_cast<double>(m.num_parameters());
  struct Case {
    json parallel;
    std::string label;
    double states;  // per rank, bytes
  };
  const Case cases[] = {
      {{{"strategy", "fsdp"}, {"fsdp", {{"sharding", "full_shard"}}}},
       "ZeRO-3 / FSDP full_shard",
       16 * shard},
      {{{"strategy", "zero"}, {"zero", {{"stage", 1}}}}, "ZeRO-1", 8 * P + 8 * shard},
      {{{"strategy", "zero"}, {"zero", {{"stage", 2}}}}, "ZeRO-2", 4 * P + 12 * shard},
      {{{"strategy", "fsdp"}, {"fsdp", {{"sharding", "shard_grad_op"}}}},
       "ZeRO-2",
       4 * P + 12 * shard},
  };
  for (const auto& c : cases) {
    write_run(dir / "run", run_json(4, c.parallel), c.states, 4);
    const ValidationResult r = validate_run((dir / "run").string(), hardware_spec("cpu"));
    EXPECT_EQ(r.strategy, c.label);
    EXPECT_NEAR(r.estimated_model_states, c.states, 1e-6) << c.label;
  }
  write_run(dir / "run", run_json(4, {{"strategy", "pipeline-magic"}}), 1, 4);
  try {
    validate_run((dir / "run").string(), hardware_spec("cpu"));
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown parallel.strategy 'pipeline-magic'"),
              std::string::npos);
  }
  EXPECT_THROW(validate_run((dir / "missing").string(), hardware_spec("cpu")),
               std::invalid_argument);
  fs::remove_all(dir);
}

TEST(PlanValidate, TrainerRunIsWithinTenPercent) {
  // A real run of the tiny model on one process: run.json from the trainer, metrics from it.
  const fs::path dir = testing::fresh_test_dir("shardtrain_plan_validate");
  {
    std::ofstream corpus(dir / "corpus.txt");
    for (int i = 0; i < 200; ++i) corpus << "the quick brown fox " << i % 7 << " jumps.\n";
  }
  TrainConfig config = parse_train_config(
      "[model]\npreset = \"tiny\"\n", "test.toml",
      {"data.corpus=\"" + (dir / "corpus.txt").string() + "\"",
       "run.dir=\"" + (dir / "run").string() + "\"", "data.seq_len=32", "train.micro_batch=4",
       "train.steps=4", "train.sample_tokens=0", "data.eval_sequences=4"});
  Trainer(config).fit();
  std::ifstream manifest(dir / "run" / "run.json");
  ASSERT_TRUE(manifest.good());
  const json run = json::parse(manifest);
  EXPECT_EQ(run["world_size"], 1);
  EXPECT_EQ(run["model"]["num_parameters"], model_preset("tiny").num_parameters());
  EXPECT_EQ(run["parallel"]["strategy"], "none");
  const ValidationResult r = validate_run((dir / "run").string(), hardware_spec("cpu"));
  EXPECT_LT(std::abs(r.model_state_error()), 0.10);
  EXPECT_EQ(r.steps, 3);
  fs::remove_all(dir);
}

}  // namespace validate_test
}  // namespace shardtrain
