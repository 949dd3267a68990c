// The planner with LoRA: adapter counts against the model's own, the frozen base's memory, and
// the decision tree's LoRA branch (DDP, else FSDP shard_grad_op, else full_shard).
#include <gtest/gtest.h>

#include "shardtrain/config.h"
#include "shardtrain/lora.h"
#include "shardtrain/plan.h"

namespace shardtrain {
namespace lora_plan_test {

Plan lora_plan(const std::string& preset, int64_t rank, const std::string& base = "bf16") {
  return make_plan(
      PlanModel::from_config(model_preset(preset)),
      ClusterOptions().gpu("h100-80gb").gpus_per_node(8),
      WorkloadOptions().seq_len(2048).micro_batch(1).activation_checkpointing(true).lora(rank,
                                                                                         base));
}

TEST(PlanLora, AdapterCountIsWhatAddLoraCreates) {
  for (const std::string preset : {"tiny", "tiny-llama"}) {
    SCOPED_TRACE(preset);
    const ModelConfig config = model_preset(preset);
    Transformer model(config, ModelInit().seed(1).deferred());
    add_lora(*model, LoraOptions().rank(4));
    int64_t trainable = 0;
    for (const auto& p : model->parameters()) trainable += p.requires_grad() ? p.numel() : 0;
    EXPECT_EQ(config.n_layers * PlanModel::from_config(config).block_lora_parameters(4), trainable);
  }
}

TEST(PlanLora, OnlyDdpAndFsdpAreCandidatesAndTheStatesAreTheAdapters) {
  const Plan full =
      make_plan(PlanModel::from_config(model_preset("llama3-8b")),
                ClusterOptions().gpu("h100-80gb").gpus_per_node(8),
                WorkloadOptions().seq_len(2048).micro_batch(1).activation_checkpointing(true));
  const Plan plan = lora_plan("llama3-8b", 16);
  ASSERT_EQ(plan.candidates.size(), 3u);
  EXPECT_EQ(plan.candidates[0].strategy, PlanStrategy::kDdp);
  EXPECT_EQ(plan.candidates[1].label(), "LoRA FSDP shard_grad_op");
  EXPECT_EQ(plan.candidates[2].label(), "LoRA FSDP full_shard");
  const Candidate& ddp = plan.candidates[0];
  const double psi = static_cast<double>(plan.model.num_parameters);
  // The bf16 base replicated (embeddings and head in fp32), and 16 bytes per adapter parameter
  // at most beside it.
  EXPECT_GE(ddp.memory.params, 2.0 * psi);
  EXPECT_LT(ddp.memory.params, 2.5 * psi);
  EXPECT_LT(ddp.memory.grads + ddp.memory.optimizer, 0.02 * psi * 16);
  EXPECT_LT(ddp.memory.model_states(), 0.2 * full.candidates[0].memory.model_states());
  // Sharding divides the frozen base too.
  EXPECT_LT(plan.candidates[2].memory.params, ddp.memory.params / 2);
}

TEST(PlanLora, LlamaEightBillionFineTunesUnderDdpAndSeventyUnderFullShard) {
  const Plan small = lora_plan("llama3-8b", 16);
  ASSERT_NE(small.recommendation(), nullptr) << small.explanation;
  EXPECT_EQ(small.recommendation()->strategy, PlanStrategy::kDdp) << small.explanation;
  EXPECT_NE(small.explanation.find("LoRA rank 16"), std::string::npos) << small.explanation;

  const Plan large = lora_plan("llama3-70b", 16);
  ASSERT_NE(large.recommendation(), nullptr) << large.explanation;
  EXPECT_FALSE(large.candidates[0].fits);  // 140 GB of bf16 base on each device
  EXPECT_EQ(large.recommendation()->strategy, PlanStrategy::kFullShard) << large.explanation;
  EXPECT_NE(large.explanation.find("does not fit replicated"), std::string::npos);
}

TEST(PlanLora, TheEmittedConfigTrainsWithAdapters) {
  const Plan plan = lora_plan("llama3-70b", 8, "fp32");
  ASSERT_NE(plan.recommendation(), nullptr);
  const std::string toml = shardtrain_toml(plan, *plan.recommendation());
  EXPECT_NE(toml.find("[lora]\nrank = 8"), std::string::npos) << toml;
  const TrainConfig config = parse_train_config(toml, "plan.toml");
  EXPECT_EQ(config.lora.rank, 8);
  EXPECT_EQ(config.parallel.strategy, ParallelStrategy::kFsdp);
  EXPECT_EQ(config.lora.base_dtype, "fp32");

  EXPECT_THROW(lora_plan("gpt2-124m", 8, "nf8"), std::invalid_argument);
}

}  // namespace lora_plan_test
}  // namespace shardtrain
