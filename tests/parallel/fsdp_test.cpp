#include "shardtrain/fsdp.h"

#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include <cmath>
#include <mutex>
#include <sstream>

#include "shardtrain/optim.h"
#include "shardtrain/rendezvous.h"

namespace shardtrain {
namespace {

constexpr int64_t kGlobalBatch = 8;
constexpr int64_t kSeq = 12;

// Odd sizes, so that no flat parameter divides evenly by 4 ranks.
ModelConfig small_config(ModelFamily family = ModelFamily::kGpt2) {
  ModelConfig config = model_preset(family == ModelFamily::kGpt2 ? "tiny" : "tiny-llama");
  config.vocab_size = 67;
  config.context_length = 16;
  config.d_model = 24;
  config.n_layers = 3;
  config.n_heads = 2;
  config.n_kv_heads = family == ModelFamily::kGpt2 ? 2 : 1;
  config.ffn_hidden = 38;
  return config;
}

// Ranks are threads sharing LibTorch's generator: seed and build one at a time.
Transformer make_model(const ModelConfig& config) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  torch::manual_seed(7);
  return Transformer(config);
}

int64_t parameter_count_of_block() {
  int64_t total = 0;
  for (const auto& p : make_model(small_config())->blocks()[0]->parameters()) total += p.numel();
  return total;
}

at::Tensor tokens(int step) {
  return (at::arange(kGlobalBatch * (kSeq + 1), at::kLong) * (7 + step) % 67)
      .view({kGlobalBatch, kSeq + 1});
}

at::Tensor loss_of(Transformer& model, const at::Tensor& batch) {
  const at::Tensor logits = model->forward(batch.narrow(1, 0, kSeq));
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}).to(at::kFloat),
                                batch.narrow(1, 1, kSeq).reshape({-1}));
}

torch::optim::AdamW make_adamw(const std::vector<at::Tensor>& decay,
                               const std::vector<at::Tensor>& no_decay) {
  // The key bias's gradient is zero in exact arithmetic (softmax cancels it) and rounding noise
  // in floating point; with eps = 1e-8 Adam turns that noise into steps of size lr whose sign
  // depends on summation order. A larger eps keeps those elements comparable.
  auto options = torch::optim::AdamWOptions(3e-3).weight_decay(0.1).eps(1e-6);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(options));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                    torch::optim::AdamWOptions(options).weight_decay(0.0)));
  return torch::optim::AdamW(std::move(groups), options);
}

std::string state_key(const at::Tensor& p) {
  std::ostringstream key;
  key << p.unsafeGetTensorImpl();
  return key.str();
}

struct TrainingRun {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> params;
  FSDPMemory memory;
  int64_t optimizer_bytes = 0;
};

TrainingRun reference(int steps, const ModelConfig& config = small_config()) {
  Transformer model = make_model(config);
  std::vector<at::Tensor> decay, no_decay;
  for (const auto& p : model->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  auto adamw = make_adamw(decay, no_decay);
  TrainingRun run;
  for (int s = 0; s < steps; ++s) {
    adamw.zero_grad();
    at::Tensor loss = loss_of(model, tokens(s));
    loss.backward();
    clip_grad_norm(model->parameters(), 0.5);
    adamw.step();
    run.losses.push_back(loss.item<double>());
  }
  for (const auto& item : model->named_parameters()) run.params[item.key()] = item.value().clone();
  return run;
}

// `world` in-process ranks, mesh dp_replicate x dp_shard, each rank on its slice of the batch.
TrainingRun sharded(int world, int replicate, FSDPOptions options, int steps, int micro = 1,
            bool checkpointing = false, const ModelConfig& config = small_config()) {
  TrainingRun result;
  std::mutex mutex;
  run_local_ranks(world, [&](ProcessGroup& group) {
    auto shared = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
    DeviceMesh mesh(shared, MeshShape().dp_replicate(replicate).dp_shard(-1));
    Transformer model = make_model(config);
    model->set_activation_checkpointing(checkpointing);
    FullyShardedDataParallel fsdp(model, mesh, options);
    std::vector<at::Tensor> decay, no_decay;
    for (const auto& s : fsdp.segments()) (s.shape.size() >= 2 ? decay : no_decay).push_back(s.param);
    auto adamw = make_adamw(decay, no_decay);
    const int64_t per_rank = kGlobalBatch / world;
    const int64_t per_micro = per_rank / micro;
    TrainingRun run;
    for (int s = 0; s < steps; ++s) {
      fsdp.zero_grad();
      double loss_sum = 0;
      for (int m = 0; m < micro; ++m) {
        at::Tensor loss =
            loss_of(model, tokens(s).narrow(0, group.rank() * per_rank + m * per_micro, per_micro));
        (loss / static_cast<double>(micro)).backward();
        loss_sum += loss.item<double>() / micro;
      }
      fsdp.clip_grad_norm(0.5);
      adamw.step();
      fsdp.after_optimizer_step();
      at::Tensor mean = at::tensor(loss_sum, at::kDouble);
      group.all_reduce(mean, ReduceOp::kAvg)->wait();
      run.losses.push_back(mean.item<double>());
    }
    for (auto& [name, value] : fsdp.full_parameters()) run.params[name] = value;
    run.memory = fsdp.memory();
    for (const auto& s : fsdp.segments()) {
      const auto& state = static_cast<const torch::optim::AdamWParamState&>(
          *adamw.state().at(state_key(s.param)));
      run.optimizer_bytes += static_cast<int64_t>(state.exp_avg().nbytes() + state.exp_avg_sq().nbytes());
    }
    std::lock_guard<std::mutex> lock(mutex);
    if (group.rank() == 0) result = std::move(run);
  });
  return result;
}

double relative(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-12); }

void expect_equivalent(const TrainingRun& got, const TrainingRun& want, double tolerance) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t s = 0; s < want.losses.size(); ++s) {
    EXPECT_LE(relative(got.losses[s], want.losses[s]), tolerance) << "step " << s;
  }
  ASSERT_EQ(got.params.size(), want.params.size());
  for (const auto& [name, value] : want.params) {
    const at::Tensor& mine = got.params.at(name);
    // Relative in the L2 norm over the tensor (see make_adamw for why not per element).
    const double diff = (mine - value).norm().item<double>();
    const double scale = value.norm().item<double>();
    EXPECT_LE(diff / scale, tolerance) << name;
  }
}

TEST(FSDP, EveryShardingStrategyMatchesSingleProcessTraining) {
  const TrainingRun want = reference(10);
  for (auto [strategy, replicate] :
       std::vector<std::pair<ShardingStrategy, int>>{{ShardingStrategy::kFullShard, 1},
                                                     {ShardingStrategy::kShardGradOp, 1},
                                                     {ShardingStrategy::kNoShard, 1},
                                                     {ShardingStrategy::kHybridShard, 2}}) {
    SCOPED_TRACE(to_string(strategy));
    expect_equivalent(sharded(4, replicate, FSDPOptions().sharding(strategy), 10), want, 1e-5);
  }
}

TEST(FSDP, AccumulationCheckpointingAndLlamaMatchSingleProcessTraining) {
  const ModelConfig llama = small_config(ModelFamily::kLlama);
  const TrainingRun want = reference(5, llama);
  expect_equivalent(sharded(4, 1, FSDPOptions(), 5, /*micro=*/2, /*checkpointing=*/true, llama),
                    want, 1e-5);
}

TEST(FSDP, EveryPrefetchModeGivesTheSameResultWithinTheGatherLimit) {
  std::vector<TrainingRun> runs;
  for (auto prefetch : {BackwardPrefetch::kBackwardPre, BackwardPrefetch::kBackwardPost,
                        BackwardPrefetch::kNone}) {
    for (int limit : {1, 2}) {
      SCOPED_TRACE(to_string(prefetch) + " limit " + std::to_string(limit));
      runs.push_back(sharded(4, 1,
                             FSDPOptions()
                                 .backward_prefetch(prefetch)
                                 .forward_prefetch(true)
                                 .limit_all_gathers(limit),
                             3));
      const FSDPMemory& m = runs.back().memory;
      EXPECT_LE(m.gathered_peak, m.root_unit + limit * m.largest_unit);
      if (limit == 2 && prefetch != BackwardPrefetch::kNone) {
        // Prefetching did happen: two blocks were gathered at once.
        EXPECT_GT(m.gathered_peak, m.root_unit + m.largest_unit);
      }
    }
  }
  for (const auto& run : runs) {
    EXPECT_EQ(run.losses, runs.front().losses);
    for (const auto& [name, value] : runs.front().params) {
      EXPECT_TRUE(run.params.at(name).equal(value)) << name;
    }
  }
}

TEST(FSDP, Bf16ParametersWithFp32ReductionStayCloseToFp32) {
  const TrainingRun want = reference(10);
  const TrainingRun got = sharded(
      4, 1,
      FSDPOptions().mixed_precision(
          MixedPrecision().param_dtype(at::kBFloat16).reduce_dtype(at::kFloat)),
      10);
  // bf16 keeps 8 bits of mantissa: each rounding is off by up to 0.4%. Over 10 steps the loss
  // stays within 2% of the fp32 run, and the fp32 master parameters, as one vector, within 2%
  // (single small tensors such as biases that start at zero drift further, relative to their
  // own small norm).
  for (size_t s = 0; s < want.losses.size(); ++s) {
    EXPECT_LE(relative(got.losses[s], want.losses[s]), 2e-2) << "step " << s;
  }
  double diff = 0, norm = 0;
  for (const auto& [name, value] : want.params) {
    EXPECT_EQ(got.params.at(name).scalar_type(), at::kFloat) << name;
    diff += (got.params.at(name) - value).pow(2).sum().item<double>();
    norm += value.pow(2).sum().item<double>();
  }
  EXPECT_LE(std::sqrt(diff / norm), 2e-2);
  EXPECT_GT(std::abs(got.losses.back() - want.losses.back()), 0.0);  // it did compute in bf16
}

TEST(FSDP, ModelStateBytesPerRankFollowTheShardingFormula) {
  const int64_t n = small_config().num_parameters();
  for (int world : {1, 2, 4}) {
    SCOPED_TRACE("world " + std::to_string(world));
    const TrainingRun run = sharded(world, 1, FSDPOptions().limit_all_gathers(1), 1);
    const FSDPMemory& m = run.memory;
    // fp32 with Adam: 4 bytes of master parameter, 4 of gradient, 8 of moments per element,
    // split over the ranks, plus the units gathered in flight.
    const double expected = 16.0 * static_cast<double>(n) / world +
                            static_cast<double>(m.root_unit + m.largest_unit);
    const double measured = static_cast<double>(m.param_shards + m.grad_shards +
                                                run.optimizer_bytes + m.gathered_peak);
    EXPECT_LE(std::abs(measured - expected) / expected, 0.10)
        << "measured " << measured << " expected " << expected;
    EXPECT_EQ(m.gathered, 0);  // nothing stays gathered between steps
  }
}

void expect_error(const std::function<void()>& fn, const std::string& fragment) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning '" << fragment << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(FSDP, BadPoliciesAndMeshesAreClearErrors) {
  run_local_ranks(2, [&](ProcessGroup& group) {
    auto shared = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
    DeviceMesh flat(shared, MeshShape());
    DeviceMesh grid(shared, MeshShape().dp_replicate(2).dp_shard(1));
    expect_error([&] {
      FullyShardedDataParallel(make_model(small_config()), flat,
                               FSDPOptions().wrap(WrapPolicy::class_name({"BertLayer"})));
    }, "BertLayer");
    expect_error([&] {
      FullyShardedDataParallel(make_model(small_config()), flat,
                               FSDPOptions().wrap(WrapPolicy::size(1000000000)));
    }, "min_params");
    expect_error([&] {
      FullyShardedDataParallel(make_model(small_config()), flat,
                               FSDPOptions().sharding(ShardingStrategy::kHybridShard));
    }, "dp_replicate");
    expect_error([&] {
      FullyShardedDataParallel(make_model(small_config()), grid, FSDPOptions());
    }, "hybrid_shard");
    expect_error([&] {
      Transformer model = make_model(small_config());
      model->blocks()->push_back(model->blocks()[0]);  // the same block twice in one forward
      FullyShardedDataParallel(model, flat, FSDPOptions());
    }, "used twice");
  });
}

TEST(FSDP, WrapPoliciesGroupBlocksIntoUnits) {
  run_local_ranks(1, [&](ProcessGroup& group) {
    auto shared = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
    DeviceMesh mesh(shared, MeshShape());
    const int64_t block = parameter_count_of_block();
    FullyShardedDataParallel by_size(make_model(small_config()), mesh,
                                     FSDPOptions().wrap(WrapPolicy::size(2 * block)));
    // Three blocks, at least two per unit: one unit of blocks 0-2 (the last block joins it),
    // then the root.
    ASSERT_EQ(by_size.unit_layout().size(), 2u);
    EXPECT_EQ(by_size.unit_layout()[0].front().rfind("blocks.0.", 0), 0u);
    EXPECT_EQ(by_size.unit_layout()[0].back().rfind("blocks.2.", 0), 0u);
    FullyShardedDataParallel by_class(make_model(small_config()), mesh,
                                      FSDPOptions().wrap(WrapPolicy::class_name({"GPT2Block"})));
    EXPECT_EQ(by_class.unit_layout().size(), 4u);
  });
}

}  // namespace
}  // namespace shardtrain
