// Candidates, the time model's pieces and the recommendation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "plan/time_model.h"
#include "shardtrain/plan.h"

namespace shardtrain {
namespace decision_test {

Plan plan_for(const std::string& preset, int gpus, int nodes = 1, bool checkpointing = true) {
  return make_plan(
      PlanModel::from_config(model_preset(preset)),
      ClusterOptions().gpu("h100-80gb").gpus_per_node(gpus).nodes(nodes),
      WorkloadOptions().seq_len(2048).micro_batch(1).activation_checkpointing(checkpointing));
}

const Candidate& find(const Plan& plan, PlanStrategy s, bool offload) {
  for (const auto& c : plan.candidates) {
    if (c.strategy == s && c.offload == offload) return c;
  }
  throw std::runtime_error("no such candidate");
}

TEST(PlanDecision, ModelThatFitsOnOneDeviceGetsDdp) {
  const Plan plan = make_plan(PlanModel::from_config(model_preset("gpt2-124m")),
                              ClusterOptions().gpu("h100-80gb").gpus_per_node(8),
                              WorkloadOptions().seq_len(1024).micro_batch(8));
  ASSERT_NE(plan.recommendation(), nullptr);
  EXPECT_EQ(plan.recommendation()->strategy, PlanStrategy::kDdp) << plan.explanation;
  EXPECT_NE(plan.explanation.find("fit on every device"), std::string::npos) << plan.explanation;
}

// The chunked loss holds one chunk of about 32 MiB of fp32 logits instead of every token's,
// and the hidden states' gradient it accumulates: the activations differ by exactly that.
TEST(PlanDecision, TheChunkedLossCountsOneChunkOfTheLogits) {
  const PlanModel model = PlanModel::from_config(model_preset("gpt2-124m"));
  const ClusterOptions cluster = ClusterOptions().gpu("h100-80gb").gpus_per_node(1);
  const auto workload = [] { return WorkloadOptions().seq_len(2048).micro_batch(2); };
  const Candidate whole = find(make_plan(model, cluster, workload()), PlanStrategy::kDdp, false);
  const Candidate chunked =
      find(make_plan(model, cluster, workload().chunked_loss(true)), PlanStrategy::kDdp, false);
  const double tokens = 2 * 2048, vocab = 50257, chunk = std::floor((32 << 20) / (4 * vocab));
  EXPECT_NEAR(whole.memory.activations - chunked.memory.activations,
              10 * (tokens - chunk) * vocab - 2 * tokens * 768, 1.0);     // 10 bytes in bf16
  EXPECT_GT(whole.memory.activations - chunked.memory.activations, 1e9);  // the logits' share
}

// 126 layers divide by no power of two above 2: the pipeline candidates split them unevenly and
// count the largest stage; FSDP x TP is a candidate whose TOML sets tp.
TEST(PlanDecision, UnevenPipelineSplitsAndFsdpTimesTpAreCandidates) {
  const PlanModel model = PlanModel::from_config(model_preset("llama3-405b"));
  const ClusterOptions cluster = ClusterOptions().gpu("h100-80gb").gpus_per_node(8).nodes(64);
  const Plan plan =
      make_plan(model, cluster, WorkloadOptions().seq_len(8192).global_batch(512).fp32_grads(true));
  const Candidate* pp16 = nullptr;
  const Candidate* fsdp_tp = nullptr;
  for (const auto& c : plan.candidates) {
    if (c.strategy == PlanStrategy::kTpPp && c.tp == 8 && c.pp == 16) pp16 = &c;
    if (c.strategy == PlanStrategy::kFullShard && c.tp == 8) fsdp_tp = &c;
  }
  ASSERT_NE(pp16, nullptr);
  ASSERT_TRUE(pp16->valid) << pp16->note;
  // Stages of 8 and 7 blocks: the same parameters per device as 128 layers in 16 even stages.
  PlanModel even = model;
  even.n_layers = 128;
  Candidate shape;
  shape.strategy = PlanStrategy::kTpPp, shape.tp = 8, shape.pp = 16;
  const Candidate as_128 = evaluate_candidate(shape, even, plan.hardware, cluster, plan.workload);
  EXPECT_DOUBLE_EQ(pp16->memory.params, as_128.memory.params);
  ASSERT_NE(fsdp_tp, nullptr);
  ASSERT_TRUE(fsdp_tp->valid) << fsdp_tp->note;
  EXPECT_EQ(fsdp_tp->label(), "FSDP full_shard x TP8");
  const std::string toml = shardtrain_toml(plan, *fsdp_tp);
  EXPECT_NE(toml.find("tp = 8"), std::string::npos) << toml;
  EXPECT_NE(toml.find("sharding = \"full_shard\""), std::string::npos) << toml;
  EXPECT_NE(toml.find("reduce_dtype = \"fp32\""), std::string::npos) << toml;  // fp32 gradients
  // A stage per layer at most.
  shape.pp = 256;
  EXPECT_FALSE(evaluate_candidate(shape, model, plan.hardware, cluster, plan.workload).valid);
}

TEST(PlanDecision, SelectiveCheckpointingSitsBetweenNoneAndFull) {
  const PlanModel model = PlanModel::from_config(model_preset("llama3.1-8b"));
  const ClusterOptions cluster = ClusterOptions().gpu("h100-80gb").gpus_per_node(8);
  auto plan = [&](bool full, bool selective) {
    return find(make_plan(model, cluster,
                          WorkloadOptions()
                              .seq_len(8192)
                              .micro_batch(2)
                              .activation_checkpointing(full)
                              .selective_checkpointing(selective)),
                PlanStrategy::kFullShard, false);
  };
  const Candidate none = plan(false, false), selective = plan(false, true),
                  full = plan(true, false);
  EXPECT_LT(full.memory.activations, selective.memory.activations);
  EXPECT_LT(selective.memory.activations, none.memory.activations);
  EXPECT_LT(none.time.compute, selective.time.compute);
  EXPECT_LT(selective.time.compute, full.time.compute);
  EXPECT_THROW(
      make_plan(model, cluster,
                WorkloadOptions().activation_checkpointing(true).selective_checkpointing(true)),
      std::invalid_argument);
}

TEST(PlanDecision, Llama70bOnEightH100IsSharded) {
  const Plan plan = plan_for("llama3-70b", 8);
  const Candidate& ddp = find(plan, PlanStrategy::kDdp, false);
  EXPECT_FALSE(ddp.fits);
  ASSERT_NE(plan.recommendation(), nullptr) << plan.explanation;
  const PlanStrategy s = plan.recommendation()->strategy;
  EXPECT_TRUE(s == PlanStrategy::kZero2 || s == PlanStrategy::kFullShard ||
              s == PlanStrategy::kHybridShard)
      << plan.recommendation()->label();
  EXPECT_NE(plan.explanation.find("Not DDP"), std::string::npos) << plan.explanation;
}

TEST(PlanDecision, AModelThatFitsNowhereIsAdvisedOnlyWhatIsOff) {
  Plan plan = plan_for("llama3-405b", 1, 1, true);
  ASSERT_EQ(plan.recommendation(), nullptr) << plan.explanation;
  EXPECT_NE(plan.explanation.find("More devices would help"), std::string::npos)
      << plan.explanation;
  plan = plan_for("llama3-405b", 1, 1, false);
  EXPECT_NE(plan.explanation.find("More devices, activation checkpointing would help"),
            std::string::npos)
      << plan.explanation;
}

TEST(PlanDecision, ParametersFewerThanTheEmbeddingAreRefused) {
  try {
    PlanModel::from_shapes(1000000, 2, 64, 4, 0, 0, 50257, false);
    ADD_FAILURE() << "1M parameters with a 50257 x 64 embedding were accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("the embedding of 50257 tokens 3216448"),
              std::string::npos)
        << e.what();
  }
}

TEST(PlanDecision, Llama70bOnTwoH100NeedsOffloadOrDoesNotFit) {
  const Plan plan = plan_for("llama3-70b", 2);
  for (const auto& c : plan.candidates) {
    if (!c.offload) {
      EXPECT_FALSE(c.fits) << c.label();
    }
  }
  const Candidate* rec = plan.recommendation();
  if (rec) {
    EXPECT_TRUE(rec->offload) << rec->label();
    EXPECT_NE(plan.explanation.find("Offload because nothing fits"), std::string::npos);
  } else {
    EXPECT_NE(plan.explanation.find("Does not fit"), std::string::npos);
  }
  // With only 256 GB of host memory there is nowhere to put 1.27 TB of offloaded state.
  const Plan small_host =
      make_plan(PlanModel::from_config(model_preset("llama3-70b")),
                ClusterOptions().gpu("h100-80gb").gpus_per_node(2).host_memory(256e9),
                WorkloadOptions().seq_len(2048).micro_batch(1).activation_checkpointing(true));
  EXPECT_EQ(small_host.recommendation(), nullptr);
  EXPECT_NE(small_host.explanation.find("Does not fit"), std::string::npos);
}

TEST(PlanDecision, HybridShardOnlyAcrossNodes) {
  const Plan one = plan_for("llama3-8b", 8, 1);
  for (const auto& c : one.candidates) EXPECT_NE(c.strategy, PlanStrategy::kHybridShard);
  const Plan four = plan_for("llama3-8b", 8, 4);
  const Candidate& h = find(four, PlanStrategy::kHybridShard, false);
  EXPECT_EQ(h.shard, 8);
  EXPECT_EQ(h.dp, 32);
  // Shards of 8 instead of 32: four times the model states of full_shard (before temporaries).
  const Candidate& f = find(four, PlanStrategy::kFullShard, false);
  EXPECT_NEAR(h.memory.model_states() / f.memory.model_states(), 4.0, 0.01);
}

TEST(PlanDecision, InvalidShapesAreMarkedNotDropped) {
  const Plan plan = make_plan(PlanModel::from_config(model_preset("gpt2-124m")),
                              ClusterOptions().gpu("a100-80gb").gpus_per_node(8),
                              WorkloadOptions().seq_len(1024).micro_batch(4).global_batch(36));
  const Candidate& ddp = find(plan, PlanStrategy::kDdp, false);
  EXPECT_FALSE(ddp.valid);
  EXPECT_NE(ddp.note.find("global batch 36 is not a multiple of micro_batch x dp = 32"),
            std::string::npos)
      << ddp.note;
}

// BERT trains under data parallelism only: its tensor, pipeline and context candidates are
// marked invalid, and the recommendation is a data-parallel one.
TEST(PlanDecision, AMaskedLanguageModelGetsDataParallelCandidatesOnly) {
  const Plan plan = make_plan(PlanModel::from_config(model_preset("bert-large")),
                              ClusterOptions().gpu("h100-80gb").gpus_per_node(8),
                              WorkloadOptions().seq_len(512).micro_batch(8));
  ASSERT_NE(plan.recommendation(), nullptr);
  int split = 0;
  for (const auto& c : plan.candidates) {
    if (c.tp == 1 && c.pp == 1 && c.cp == 1 && c.ep == 1) continue;
    ++split;
    EXPECT_FALSE(c.valid) << c.label();
    EXPECT_NE(c.note.find("trains under data parallelism only"), std::string::npos) << c.note;
  }
  EXPECT_GT(split, 0);
  const Candidate* best = plan.recommendation();
  EXPECT_EQ(best->tp * best->pp * best->cp * best->ep, 1) << best->label();
}

TEST(PlanDecision, BadInputsNameTheCause) {
  const PlanModel m = PlanModel::from_config(model_preset("tiny"));
  EXPECT_THROW(make_plan(m, ClusterOptions().gpu("tpu-v5"), WorkloadOptions()),
               std::invalid_argument);
  EXPECT_THROW(make_plan(m, ClusterOptions().gpus_per_node(0), WorkloadOptions()),
               std::invalid_argument);
  EXPECT_THROW(make_plan(m, ClusterOptions().inter("carrier-pigeon"), WorkloadOptions()),
               std::invalid_argument);
  try {
    make_plan(m, ClusterOptions(), WorkloadOptions().precision("fp8"));
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("fp8"), std::string::npos);
  }
}

TEST(PlanTimeModel, RingCollectivesAndFlops) {
  const detail::GroupLink link{100e9, 5e-6};
  // all-reduce: 2(n-1) steps of alpha plus 2(n-1)/n S / beta.
  EXPECT_DOUBLE_EQ(detail::all_reduce_time(1e9, 8, link), 14 * 5e-6 + 2.0 * 7 / 8 * 1e9 / 100e9);
  EXPECT_DOUBLE_EQ(detail::all_gather_time(1e9, 4, link), 3 * 5e-6 + 3.0 / 4 * 1e9 / 100e9);
  EXPECT_EQ(detail::all_reduce_time(1e9, 1, link), 0.0);
  // 6 FLOPs per matmul parameter and 12 L h s for attention (PaLM's accounting).
  const PlanModel m = PlanModel::from_config(model_preset("gpt2-124m"));
  const double matmul = 12.0 * m.block_parameters + 50257.0 * 768;
  EXPECT_DOUBLE_EQ(detail::training_flops_per_token(m, 1024, false),
                   6 * matmul + 12.0 * 12 * 768 * 1024);
  EXPECT_DOUBLE_EQ(detail::training_flops_per_token(m, 1024, true),
                   8 * matmul + 16.0 * 12 * 768 * 1024);
}

// A mixture of experts: memory by every parameter, FLOPs by those a token computes with.
// Mixtral 8x7B against a dense model of its active size's shape (Mistral 7B: the same
// attention, one SwiGLU of the experts' width per block).
TEST(PlanTimeModel, MixtureOfExpertsCountsMemoryByTotalAndFlopsByActiveParameters) {
  const PlanModel moe = PlanModel::from_config(model_preset("mixtral-8x7b"));
  ModelConfig dense_config = model_preset("mixtral-8x7b");
  dense_config.n_experts = 0;
  dense_config.experts_per_token = 0;
  dense_config.hf_model_type.clear();
  const PlanModel dense = PlanModel::from_config(dense_config);
  EXPECT_EQ(moe.num_parameters, model_preset("mixtral-8x7b").num_parameters());
  EXPECT_EQ(moe.active_parameters, model_preset("mixtral-8x7b").active_parameters());
  // A token passes two experts where the dense block has one MLP: one more MLP's matmuls.
  const double mlp = 3.0 * 4096 * 14336;
  EXPECT_DOUBLE_EQ(detail::training_flops_per_token(moe, 4096, false),
                   detail::training_flops_per_token(dense, 4096, false) + 6.0 * 32 * mlp +
                       6.0 * 32 * 8 * 4096);  // and the router's [8 x 4096]
  const Plan plan = make_plan(moe, ClusterOptions().gpu("h100-80gb").gpus_per_node(8),
                              WorkloadOptions().seq_len(4096).micro_batch(1));
  const Plan dense_plan = make_plan(dense, ClusterOptions().gpu("h100-80gb").gpus_per_node(8),
                                    WorkloadOptions().seq_len(4096).micro_batch(1));
  const Candidate& ddp = find(plan, PlanStrategy::kDdp, false);
  EXPECT_FALSE(ddp.fits);  // 46.7B parameters' state on each device
  EXPECT_GT(ddp.memory.params, 6.0 * find(dense_plan, PlanStrategy::kDdp, false).memory.params);
  EXPECT_GT(ddp.memory.activations, find(dense_plan, PlanStrategy::kDdp, false).memory.activations);
  EXPECT_NE(format_plan(plan).find("12.88B active: 2 of 8 experts per token"), std::string::npos)
      << format_plan(plan);
  // What the trainer refuses for it (context parallelism) is not proposed.
  for (const Candidate& c : plan.candidates) {
    EXPECT_TRUE(c.cp == 1 || !c.valid) << c.label();
  }
}

const Candidate& find_ep(const Plan& plan, PlanStrategy s, int ep) {
  for (const auto& c : plan.candidates) {
    if (c.strategy == s && !c.offload && c.ep == ep && c.tp == 1) return c;
  }
  throw std::runtime_error("no such candidate");
}

// Expert parallelism: a device holds 1/ep of every block's experts. Under ZeRO-1 (whole
// parameters on every device) the replica shrinks by the experts' (ep - 1)/ep; under full_shard
// the model states stay 1/dp, and the unit gathered per block holds 1/ep of its experts; each
// MoE layer's all-to-alls join the critical path.
TEST(PlanTimeModel, ExpertParallelismSplitsTheExpertsOverEp) {
  const PlanModel moe = PlanModel::from_config(model_preset("mixtral-8x7b"));
  const Plan plan = make_plan(moe, ClusterOptions().gpu("h100-80gb").gpus_per_node(8).nodes(2),
                              WorkloadOptions().seq_len(4096).micro_batch(1));
  const double experts = 8.0 * 3 * 4096 * 14336, block = static_cast<double>(moe.block_parameters);
  const double root = static_cast<double>(moe.root_parameters);
  const Candidate& zero1 = find(plan, PlanStrategy::kZero1, false);
  for (int ep : {2, 4, 8}) {
    SCOPED_TRACE(ep);
    const Candidate& split = find_ep(plan, PlanStrategy::kZero1, ep);
    ASSERT_TRUE(split.valid) << split.note;
    EXPECT_NE(split.label().find("x EP" + std::to_string(ep)), std::string::npos);
    const double replica = 32 * (block - experts + experts / ep) + root;
    EXPECT_NEAR(split.memory.params / zero1.memory.params, replica / (32 * block + root), 1e-9);
    EXPECT_GT(split.time.exposed_comm, 0.0);
    const Candidate& sharded = find_ep(plan, PlanStrategy::kFullShard, ep);
    ASSERT_TRUE(sharded.valid) << sharded.note;
    EXPECT_LT(sharded.memory.temporary,
              find(plan, PlanStrategy::kFullShard, false).memory.temporary);
    EXPECT_NEAR(
        sharded.memory.optimizer / find(plan, PlanStrategy::kFullShard, false).memory.optimizer,
        1.0, 1e-3);
  }
  // ep must divide the experts: none of 16.
  for (const Candidate& c : plan.candidates) EXPECT_LE(c.ep, 8) << c.label();
  // The TOML of an expert-parallel candidate trains with parallel.ep.
  EXPECT_NE(shardtrain_toml(plan, find_ep(plan, PlanStrategy::kFullShard, 4)).find("ep = 4\n"),
            std::string::npos);
}

TEST(PlanTimeModel, CrossingNodesUsesTheSlowerLink) {
  const LinkSpec nvlink = link_spec("nvlink", "h100-80gb");
  const LinkSpec ib = link_spec("ib");
  ClusterOptions cluster = ClusterOptions().gpus_per_node(8).nodes(4);
  // Inside a node: NVLink's 450 GB/s per direction.
  EXPECT_DOUBLE_EQ(detail::group_link(8, 8, cluster, nvlink, ib).bandwidth, 450e9);
  // A group with all 8 ranks of each node: the node's 8 x 50 GB/s.
  EXPECT_DOUBLE_EQ(detail::group_link(32, 8, cluster, nvlink, ib).bandwidth, 400e9);
  // Eight such groups side by side (one rank per node each) share it.
  EXPECT_DOUBLE_EQ(detail::group_link(4, 1, cluster, nvlink, ib).bandwidth, 50e9);
  cluster.inter("ethernet");
  EXPECT_DOUBLE_EQ(detail::group_link(32, 8, cluster, nvlink, link_spec("ethernet")).bandwidth,
                   12.5e9);
}

TEST(PlanTimeModel, MoreDevicesMoreTokensForTheSameBatch) {
  auto tokens = [](int gpus) {
    const Plan plan = make_plan(
        PlanModel::from_config(model_preset("llama3-8b")), ClusterOptions().gpus_per_node(gpus),
        WorkloadOptions().seq_len(4096).micro_batch(1).global_batch(64).activation_checkpointing(
            true));
    return find(plan, PlanStrategy::kFullShard, false);
  };
  const Candidate two = tokens(2), eight = tokens(8);
  EXPECT_EQ(two.grad_accum, 32);
  EXPECT_EQ(eight.grad_accum, 8);
  EXPECT_GT(eight.tokens_per_s, 3.0 * two.tokens_per_s);
  EXPECT_LE(eight.scaling_efficiency, 1.0);
}

}  // namespace decision_test
}  // namespace shardtrain
