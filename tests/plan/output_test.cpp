// What the planner writes: configs, JSON, the chart, and the CLI around them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "shardtrain/config.h"
#include "shardtrain/plan.h"
#include "support.h"

namespace shardtrain {
namespace output_test {

Candidate pick(const Plan& plan, PlanStrategy s, bool offload, int tp = 1, int pp = 1) {
  for (const auto& c : plan.candidates) {
    if (c.strategy == s && c.offload == offload && c.tp == tp && c.pp == pp) return c;
  }
  throw std::runtime_error("no such candidate");
}

bool has(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

class PlanOutput : public ::testing::Test {
 protected:
  Plan plan_ = make_plan(
      PlanModel::from_config(model_preset("llama3-8b")), ClusterOptions().gpus_per_node(8).nodes(2),
      WorkloadOptions().seq_len(4096).micro_batch(2).global_batch(128).activation_checkpointing(
          true));
};

TEST_F(PlanOutput, ShardtrainTomlNamesEveryKey) {
  const std::string full = shardtrain_toml(plan_, pick(plan_, PlanStrategy::kFullShard, true));
  for (const char* line :
       {"preset = \"llama3-8b\"", "seq_len = 4096", "micro_batch = 2", "grad_accum = 4",
        "activation_checkpointing = true", "strategy = \"fsdp\"", "[parallel.fsdp]",
        "sharding = \"full_shard\"", "cpu_offload = true", "wrap = \"block\"",
        "param_dtype = \"bf16\"", "reduce_dtype = \"bf16\"", "autocast = \"bf16\""}) {
    EXPECT_TRUE(has(full, line)) << line << "\n" << full;
  }
  const std::string hybrid = shardtrain_toml(plan_, pick(plan_, PlanStrategy::kHybridShard, false));
  EXPECT_TRUE(has(hybrid, "sharding = \"hybrid_shard\"\nreplicate = 2")) << hybrid;
  const std::string zero2 = shardtrain_toml(plan_, pick(plan_, PlanStrategy::kZero2, true));
  EXPECT_TRUE(has(zero2, "strategy = \"zero\""));
  EXPECT_TRUE(has(zero2, "stage = 2\noffload_optimizer = \"cpu\"\noffload_param = \"none\""));
  const std::string tp = shardtrain_toml(plan_, pick(plan_, PlanStrategy::kTpPp, false, 4, 2));
  // Tensor parallelism (with sequence parallelism, as the memory model assumes) and the
  // pipeline, with ZeRO-1 across the data-parallel ranks as the estimate assumes.
  EXPECT_TRUE(has(tp, "tp = 4\nsequence_parallel = true\npp = 2\npp_schedule = \"1f1b\"")) << tp;
  EXPECT_TRUE(has(tp, "strategy = \"zero\"")) << tp;
  EXPECT_TRUE(has(tp, "[parallel.zero]\nstage = 1\noffload_optimizer = \"none\"")) << tp;
  // 128 / (micro-batch 2 x dp 2): the micro-batches the pipeline runs per step.
  EXPECT_TRUE(has(tp, "grad_accum = 32")) << tp;
}

TEST_F(PlanOutput, DeepSpeedConfigIsConsistent) {
  for (const auto& c : plan_.candidates) {
    if (!c.valid) continue;
    const auto ds = nlohmann::json::parse(deepspeed_json(plan_, c));
    // DeepSpeed checks train_batch_size = micro x accumulation x data-parallel size.
    EXPECT_EQ(ds["train_batch_size"].get<int64_t>(), 128) << c.label();
    EXPECT_EQ(ds["train_micro_batch_size_per_gpu"].get<int64_t>() *
                  ds["gradient_accumulation_steps"].get<int64_t>() * c.dp,
              128);
    EXPECT_TRUE(ds["bf16"]["enabled"].get<bool>());
  }
  const auto z3 =
      nlohmann::json::parse(deepspeed_json(plan_, pick(plan_, PlanStrategy::kFullShard, true)));
  EXPECT_EQ(z3["zero_optimization"]["stage"], 3);
  EXPECT_EQ(z3["zero_optimization"]["offload_optimizer"]["device"], "cpu");
  EXPECT_EQ(z3["zero_optimization"]["offload_param"]["device"], "cpu");
  const auto hy =
      nlohmann::json::parse(deepspeed_json(plan_, pick(plan_, PlanStrategy::kHybridShard, false)));
  EXPECT_EQ(hy["zero_optimization"]["mics_shard_size"], 8);
  const auto z1 =
      nlohmann::json::parse(deepspeed_json(plan_, pick(plan_, PlanStrategy::kZero1, false)));
  EXPECT_EQ(z1["zero_optimization"]["stage"], 1);
  EXPECT_FALSE(z1["zero_optimization"].contains("offload_optimizer"));
}

TEST_F(PlanOutput, AccelerateYamlPerStrategy) {
  const std::string fsdp = accelerate_yaml(plan_, pick(plan_, PlanStrategy::kHybridShard, true));
  EXPECT_TRUE(has(fsdp, "distributed_type: FSDP"));
  EXPECT_TRUE(has(fsdp, "fsdp_sharding_strategy: HYBRID_SHARD"));
  EXPECT_TRUE(has(fsdp, "fsdp_offload_params: true"));
  EXPECT_TRUE(has(fsdp, "fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer"));
  EXPECT_TRUE(has(fsdp, "num_machines: 2\nnum_processes: 16"));
  const std::string ds = accelerate_yaml(plan_, pick(plan_, PlanStrategy::kZero2, false));
  EXPECT_TRUE(has(ds, "distributed_type: DEEPSPEED"));
  EXPECT_TRUE(has(ds, "zero_stage: 2"));
  const std::string mg = accelerate_yaml(plan_, pick(plan_, PlanStrategy::kTpPp, false, 2, 2));
  EXPECT_TRUE(has(mg, "distributed_type: DEEPSPEED")) << mg;
  EXPECT_TRUE(has(mg, "zero_stage: 1")) << mg;
  EXPECT_TRUE(has(mg, "tensor parallel 2 x pipeline parallel 2 have no keys in this file")) << mg;
  EXPECT_TRUE(has(accelerate_yaml(plan_, pick(plan_, PlanStrategy::kDdp, false)),
                  "distributed_type: MULTI_GPU"));
}

TEST_F(PlanOutput, JsonAndChartCoverEveryCandidate) {
  const auto j = nlohmann::json::parse(plan_to_json(plan_));
  ASSERT_EQ(j["candidates"].size(), plan_.candidates.size());
  int valid = 0;
  for (size_t i = 0; i < plan_.candidates.size(); ++i) {
    const auto& c = plan_.candidates[i];
    EXPECT_EQ(j["candidates"][i]["label"], c.label());
    if (!c.valid) continue;
    ++valid;
    const auto& m = j["candidates"][i]["memory"];
    EXPECT_DOUBLE_EQ(m["total"].get<double>(),
                     m["params"].get<double>() + m["grads"].get<double>() +
                         m["optimizer"].get<double>() + m["activations"].get<double>() +
                         m["temporary"].get<double>());
  }
  EXPECT_EQ(j["recommended"].get<int>(), plan_.recommended);
  ASSERT_GE(plan_.recommended, 0);
  EXPECT_TRUE(has(j["configs"]["shardtrain_toml"].get<std::string>(), "[parallel]"));
  const std::string svg = memory_chart_svg(plan_);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_TRUE(has(svg, "</svg>"));
  // One text label per valid candidate, escaped.
  size_t labels = 0;
  for (size_t at = svg.find("<text x=\"10\" y=\"", 40); at != std::string::npos;
       at = svg.find("<text x=\"10\" y=\"", at + 1)) {
    ++labels;
  }
  EXPECT_EQ(labels, static_cast<size_t>(valid) + 1);  // + the title
}

std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(PlanCli, PrintsWritesAndRejects) {
  const auto dir = testing::fresh_test_dir("shardtrain_plan_cli");
  const auto out = testing::run_command(
      testing::cli() + " plan --model llama3-8b --gpus 8 --seq-len 4096 --checkpointing --chart " +
      (dir / "mem.svg").string() + " --out " + (dir / "cfg").string());
  ASSERT_EQ(out.exit_code, 0) << out.output;
  EXPECT_TRUE(has(out.output, "Recommended:")) << out.output;
  EXPECT_TRUE(std::filesystem::exists(dir / "mem.svg"));
  for (const char* f : {"shardtrain.toml", "ds_config.json", "accelerate.yaml"}) {
    EXPECT_TRUE(std::filesystem::exists(dir / "cfg" / f)) << f;
  }
  // A file edited by hand is not replaced without --force; nothing is printed before the refusal.
  { std::ofstream(dir / "cfg" / "shardtrain.toml") << "# mine\n"; }
  const std::string again =
      testing::cli() + " plan --model llama3-8b --gpus 8 --out " + (dir / "cfg").string();
  const auto refused = testing::run_command(again);
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_TRUE(has(refused.output, "shardtrain.toml', '")) << refused.output;
  EXPECT_TRUE(has(refused.output, "already exist(s); pass --force")) << refused.output;
  EXPECT_FALSE(has(refused.output, "Recommended:")) << refused.output;
  EXPECT_EQ(slurp(dir / "cfg" / "shardtrain.toml"), "# mine\n");
  const auto forced = testing::run_command(again + " --force");
  EXPECT_EQ(forced.exit_code, 0) << forced.output;
  EXPECT_TRUE(has(slurp(dir / "cfg" / "shardtrain.toml"), "[parallel]"));
  const auto json = testing::run_command(testing::cli() +
                                         " plan --params 7e9 --layers 32 --d-model 4096 --heads 32 "
                                         "--ffn 11008 --gated-mlp --gpu a100-80gb --gpus 4 --json");
  ASSERT_EQ(json.exit_code, 0) << json.output;
  EXPECT_EQ(nlohmann::json::parse(json.output)["model"]["num_parameters"], 7000000000LL);
  const auto bad = testing::run_command(testing::cli() + " plan --model gpt5");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_TRUE(has(bad.output, "unknown model preset 'gpt5'")) << bad.output;
  const auto bad_gpu = testing::run_command(testing::cli() + " plan --model tiny --gpu v100");
  EXPECT_EQ(bad_gpu.exit_code, 2);
  EXPECT_TRUE(has(bad_gpu.output, "unknown hardware kind 'v100'")) << bad_gpu.output;
  std::filesystem::remove_all(dir);
}

// Sizes outside what the tables can hold, and links or amounts that mean nothing, are refused
// naming the flag or the quantity, before anything is printed (no wrapped device counts).
TEST(PlanCli, NumbersOutsideTheirRangeAreRefused) {
  const std::string shapes = " --layers 32 --d-model 4096 --heads 32";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--params 1e30" + shapes,
       "--params must be a parameter count between 1 and 1e15, got 1e+30"},
      {"--params nan" + shapes, "--params must be"},
      {"--params -7e9" + shapes, "--params must be"},
      {"--model llama3-8b --gpus 100000000", "devices per node must be between 1 and 1024"},
      {"--model llama3-8b --nodes 100000000", "nodes must be between 1 and 65536"},
      {"--model tiny --intra ethernet", "intra-node link 'ethernet'"},
      {"--model tiny --host-mem-gb -1", "host memory must be"},
      {"--model tiny --nodes 2 --inter-gbps nan", "inter-node bandwidth must be"},
      {"--model tiny --seq-len 9000000000000", "seq_len must be between"},
      {"--measure-host --threads 100000", "--threads"},
  };
  for (const auto& [flags, message] : cases) {
    const auto out = testing::run_command(testing::cli() + " plan " + flags);
    EXPECT_EQ(out.exit_code, 2) << flags << "\n" << out.output;
    EXPECT_TRUE(has(out.output, message)) << flags << "\n" << out.output;
    EXPECT_FALSE(has(out.output, "Recommended:")) << flags << "\n" << out.output;
  }
}

// What `plan --out` writes for each kind of recommendation is accepted by `train` as it is (with
// a corpus given by --set): the TOML, the ds_config.json through --deepspeed and the accelerate
// YAML through --accelerate-config.
TEST_F(PlanOutput, EveryEmittedConfigIsAcceptedByTheTrainer) {
  std::set<PlanStrategy> kinds;
  for (const auto& c : plan_.candidates) {
    if (!c.valid || !kinds.insert(c.strategy).second) continue;
    SCOPED_TRACE(c.label());
    const std::vector<std::string> corpus = {"data.corpus=\"corpus.txt\""};
    TrainConfig from_toml =
        parse_train_config(shardtrain_toml(plan_, c), "shardtrain.toml", corpus);
    EXPECT_EQ(from_toml.train.grad_accum, c.grad_accum);
    EXPECT_EQ(from_toml.parallel.pp, c.strategy == PlanStrategy::kTpPp ? c.pp : 1);
    auto yaml = accelerate_overrides_from_yaml(accelerate_yaml(plan_, c), "accelerate.yaml",
                                               plan_.cluster.world_size());
    yaml.insert(yaml.end(), corpus.begin(), corpus.end());
    const TrainConfig from_yaml = parse_train_config("", "empty.toml", yaml);
    // The YAML trains the data-parallel part only (ZeRO-1 over every rank).
    EXPECT_EQ(from_yaml.parallel.strategy, from_toml.parallel.strategy);
    // DeepSpeed's batch arithmetic counts data-parallel ranks only: with tensor and pipeline
    // parallelism that is fewer than the world, a layout this version does not run.
    if (c.strategy == PlanStrategy::kTpPp) continue;
    auto ds = deepspeed_overrides_from_json(deepspeed_json(plan_, c), "ds_config.json",
                                            plan_.cluster.world_size());
    ds.insert(ds.end(), corpus.begin(), corpus.end());
    const TrainConfig from_ds = parse_train_config("", "empty.toml", ds);
    EXPECT_EQ(from_ds.train.grad_accum, c.grad_accum);
  }
  EXPECT_EQ(kinds.size(), 6u);
}

}  // namespace output_test
}  // namespace shardtrain
