#include "shardtrain/fsdp.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>

#include "parallel/sharded_training.h"
#include "shardtrain/rendezvous.h"

namespace shardtrain {
namespace fsdp_test {

using namespace testing;

TrainingRun sharded(int world, int replicate, FSDPOptions options, int steps, int micro = 1,
                    bool checkpointing = false, const ModelConfig& config = small_config()) {
  return sharded_by(
      world, replicate,
      [&](Transformer model, const DeviceMesh& mesh) {
        return std::make_unique<FullyShardedDataParallel>(model, mesh, options);
      },
      steps, micro, checkpointing, config);
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

TEST(FSDP, ATiedEmbeddingsGradientReducedInTwoPartsMatchesSingleProcessTraining) {
  // The tied token embedding's gradient is the head's (dense, reduce-scattered as the loss's
  // backward forms it) plus the lookup's (rows gathered from every rank at the end): with the
  // chunked loss and with the whole logits (whose head part autograd leaves in .grad), with
  // gradient accumulation, and under hybrid_shard, where it is not split. At 2 ranks the
  // shards meet inside a row of the embedding (the root's 2,040 elements split at 1,020, row 42
  // of 24-wide rows), whose halves each rank adds.
  const ModelConfig config = small_config();
  ASSERT_TRUE(config.tie_embeddings);
  for (const int64_t chunk : {int64_t{0}, int64_t{7}}) {
    const TrainingRun want = reference(5, config, chunk);
    for (const auto& [world, replicate] : std::vector<std::pair<int, int>>{{2, 1}, {4, 2}}) {
      for (const auto strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp}) {
        if (replicate > 1 && strategy == ShardingStrategy::kShardGradOp) continue;
        const auto sharding = replicate > 1 ? ShardingStrategy::kHybridShard : strategy;
        SCOPED_TRACE(to_string(sharding) + " on " + std::to_string(world) + " ranks, chunk " +
                     std::to_string(chunk));
        std::atomic<int> sinks{0};
        const TrainingRun got = sharded_by(
            world, replicate,
            [&](Transformer model, const DeviceMesh& mesh) {
              auto fsdp = std::make_unique<FullyShardedDataParallel>(
                  model, mesh, FSDPOptions().sharding(sharding));
              if (model->tied_gradient_sink()) ++sinks;
              return fsdp;
            },
            5, /*micro=*/2, /*checkpointing=*/false, config, chunk);
        EXPECT_EQ(sinks.load(), replicate == 1 ? world : 0);
        expect_equivalent(got, want, 1e-5);
      }
    }
  }
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

}  // namespace fsdp_test
}  // namespace shardtrain
