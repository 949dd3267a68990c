// The trainer with a mixture-of-experts model (tiny-moe, tiny-qwen3-moe): under DDP, FSDP,
// ZeRO-3 and a pipeline it trains as one process does on the same global batch (losses, the
// load-balancing loss, the tokens per expert and the final parameters), LoRA adapts its experts,
// a checkpoint resumes under another strategy, metrics.jsonl reports the routing, and what this
// version does not split (sequences across cp ranks) is refused. Expert parallelism:
// ep_trainer_test.cpp.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "shardtrain/checkpoint.h"
#include "shardtrain/hf.h"
#include "shardtrain/lora.h"
#include "shardtrain/rendezvous.h"
#include "shardtrain/train.h"
#include "support.h"
#include "train/local_training.h"
#include "train/moe_training.h"

namespace shardtrain {
namespace moe_trainer_test {

namespace fs = std::filesystem;
using Layout = testing::MoeLayout;
using RankRun = testing::MoeRun;
using testing::expect_same_routing;

// Four micro-batches of 2 sequences of 16 tokens per step (the pipeline's), as the families'
// test; data-parallel layouts take half a micro-batch each. Six steps.
class MoeTrainerTest : public testing::MoeTrainingTest {
 protected:
  MoeTrainerTest() { steps_ = 6; }
};

TEST_P(MoeTrainerTest, EveryStrategyTrainsAsOneProcess) {
  const Layout one{"one", 1, {}};
  const RankRun want = testing::run_moe(1, config(one, "one"), 6);
  // The routing of a whole global batch: 8 sequences x 16 tokens x 2 experts over 4 experts.
  for (const StepResult& step : want.steps) {
    EXPECT_EQ(step.expert_tokens_mean, 8 * 16 * 2 / 4);
    EXPECT_LE(step.expert_tokens_min, step.expert_tokens_mean);
    EXPECT_GE(step.expert_tokens_max, step.expert_tokens_mean);
    EXPECT_GT(step.aux_loss, 0.0);
  }
  const std::vector<Layout> layouts = {
      {"ddp", 2, {"parallel.strategy=\"ddp\"", "train.micro_batch=1"}},
      {"fsdp", 2, {"parallel.strategy=\"fsdp\"", "train.micro_batch=1"}},
      {"zero3", 2, {"parallel.strategy=\"zero\"", "parallel.zero.stage=3", "train.micro_batch=1"}},
      {"pp2", 2, {"parallel.pp=2"}},
      // The experts split by tensor parallelism as the dense MLP, the router replicated.
      {"tp2", 2, {"parallel.tp=2"}},
      {"ckpt", 1, {"train.activation_checkpointing=true"}}};
  for (const Layout& layout : layouts) {
    SCOPED_TRACE(layout.name);
    const RankRun got = testing::run_moe(layout.world, config(layout, layout.name), 6);
    testing::expect_same_losses(got.losses(), want.losses(), 1e-5);
    expect_same_routing(got, want);
    testing::expect_same_parameters(got.checkpoint, want.checkpoint);
  }
  // metrics.jsonl reports the routing of each step.
  Trainer(config(one, "fit")).fit();
  std::ifstream metrics(dir_ / "fit" / "metrics.jsonl");
  std::string line;
  int reported = 0;
  while (std::getline(metrics, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (!j.contains("step")) continue;
    ASSERT_TRUE(j.contains("aux_loss")) << line;
    EXPECT_EQ(j.at("expert_tokens").at("mean").get<double>(), 64.0);
    ++reported;
  }
  EXPECT_EQ(reported, 6);
}

TEST_P(MoeTrainerTest, TheLoadBalancingLossChangesTheTraining) {
  const Layout one{"one", 1, {}};
  const RankRun with = testing::run_moe(1, config(one, "with"), 3);
  const RankRun without =
      testing::run_moe(1, config(one, "without", {"model.router_aux_loss_coef=0"}), 3);
  // The same first step (the loss it returns never includes the load-balancing loss); the
  // gradients differ, so the steps after do.
  EXPECT_DOUBLE_EQ(with.steps[0].loss, without.steps[0].loss);
  EXPECT_NE(with.steps[2].loss, without.steps[2].loss);
}

TEST_P(MoeTrainerTest, LoraAdaptsTheExpertsAndCheckpointsResumeUnderAnotherStrategy) {
  const Layout one{"one", 1, {}};
  const std::vector<std::string> lora = {"lora.rank=4", "lora.alpha=8"};
  const RankRun single = testing::run_moe(1, config(one, "lora_one", lora), 4);
  const Layout fsdp{"lora_fsdp", 2, {"parallel.strategy=\"fsdp\"", "train.micro_batch=1"}};
  const RankRun sharded = testing::run_moe(2, config(fsdp, "lora_fsdp", lora), 4);
  testing::expect_same_losses(sharded.losses(), single.losses(), 1e-5);
  const ShardedCheckpointReader adapters(single.checkpoint);
  EXPECT_NE(adapters.find("blocks.1.moe.experts.3.down.lora_B.weight"), nullptr);
  // Exported as PEFT adapters under Hugging Face's expert names, and merged into a model that
  // loads back.
  export_lora_checkpoint(single.checkpoint, (dir_ / "peft").string(), LoraExport::kAdapters);
  const auto peft = load_safetensors((dir_ / "peft" / "adapter_model.safetensors").string());
  const std::string expert_down =
      GetParam() == "tiny-moe" ? "block_sparse_moe.experts.3.w2" : "mlp.experts.3.down_proj";
  EXPECT_EQ(peft.count("base_model.model.model.layers.1." + expert_down + ".lora_B.weight"), 1u);
  export_lora_checkpoint(single.checkpoint, (dir_ / "merged").string(), LoraExport::kMerged);
  Transformer merged(model_config_from_hf_json((dir_ / "merged" / "config.json").string()));
  EXPECT_EQ(merged->config().n_experts, 4);
  load_hf_weights(merged, (dir_ / "merged").string());

  const RankRun whole = testing::run_moe(1, config(one, "whole"), 4);
  const RankRun first = testing::run_moe(
      2, config(Layout{"fsdp", 2, {"parallel.strategy=\"fsdp\"", "train.micro_batch=1"}}, "first"),
      2);
  const Layout pp{"pp2", 2, {"parallel.pp=2"}};
  const RankRun rest =
      testing::run_moe(2, config(pp, "resumed", {"run.resume=\"" + first.checkpoint + "\""}), 2);
  testing::expect_same_losses(rest.losses(), {whole.steps[2].loss, whole.steps[3].loss}, 1e-5);
}

TEST_P(MoeTrainerTest, RefusesContextParallelism) {
  const Layout cp{"cp", 2, {"parallel.cp=2", "parallel.strategy=\"ddp\""}};
  testing::expect_refused(
      2, [&] { return config(cp, "cp"); }, "trains mixture-of-experts models with cp = 1");
  EXPECT_FALSE(fs::exists(dir_ / "cp" / "metrics.jsonl"));
}

INSTANTIATE_TEST_SUITE_P(Models, MoeTrainerTest, ::testing::Values("tiny-moe", "tiny-qwen3-moe"),
                         testing::preset_test_name);

}  // namespace moe_trainer_test
}  // namespace shardtrain
