#include "shardtrain/zero.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "parallel/sharded_training.h"
#include "support.h"

namespace shardtrain {
namespace zero_test {

using namespace testing;

TrainingRun zero_run(int world, ZeroOptions options, int steps, int micro = 1) {
  return sharded_by(
      world, 1,
      [&](Transformer model, const DeviceMesh& mesh) { return zero_shard(model, mesh, options); },
      steps, micro);
}

TEST(Zero, EveryStageMatchesSingleProcessTraining) {
  const TrainingRun want = reference(10);
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    expect_equivalent(zero_run(4, ZeroOptions().stage(stage), 10), want, 1e-5);
  }
}

TEST(Zero, DeepSpeedKnobsChangeWhenDataMovesNotWhatIsComputed) {
  const TrainingRun plain = zero_run(4, ZeroOptions().stage(3), 3, /*micro=*/2);
  ZeroBehaviour knobs;
  knobs.overlap_comm = false;
  knobs.reduce_bucket_size = 100;       // smaller than a unit: one reduction at a time
  knobs.allgather_bucket_size = 100;
  knobs.prefetch_bucket_size = 1000000;  // prefetch everything ahead...
  knobs.max_live_parameters = 5000;      // ...that fits under this
  knobs.persistence_threshold = 3000;    // blocks of this model are larger: only the root persists
  const TrainingRun tuned = zero_run(4, ZeroOptions().stage(3).behaviour(knobs), 3, 2);
  EXPECT_EQ(tuned.losses, plain.losses);
  for (const auto& [name, value] : plain.params) {
    EXPECT_TRUE(tuned.params.at(name).equal(value)) << name;
  }
  ZeroBehaviour stage2 = knobs;
  const TrainingRun two = zero_run(4, ZeroOptions().stage(2).behaviour(stage2), 3, 2);
  for (size_t s = 0; s < plain.losses.size(); ++s) {
    EXPECT_LE(relative(two.losses[s], plain.losses[s]), 1e-5);
  }
}

TEST(Zero, PrefetchHoldsTheBucketAheadAndNoMore) {
  // stage3_prefetch_bucket_size bounds the elements gathered ahead of the unit that computes,
  // those already gathered included: two blocks' worth keeps the root, the block computing and
  // two ahead gathered, however many blocks the model has (not a bucket more at each block).
  ModelConfig config = small_config();
  config.n_layers = 6;
  const int64_t block = parameter_count_of_block();
  ZeroBehaviour knobs;
  knobs.prefetch_bucket_size = 2 * (block + 1);  // two blocks, each padded to an even count
  const ZeroOptions options = ZeroOptions().stage(3).behaviour(knobs);
  const TrainingRun run = sharded_by(
      2, 1,
      [&](Transformer model, const DeviceMesh& mesh) { return zero_shard(model, mesh, options); },
      2, 1, false, config);
  const FSDPMemory& m = run.memory;
  EXPECT_GT(m.gathered_peak, m.root_unit + 2 * m.largest_unit);  // it did prefetch
  EXPECT_LE(m.gathered_peak, m.root_unit + 3 * m.largest_unit);
  expect_equivalent(run, reference(2, config), 1e-5);
}

TEST(Zero, ModelStateBytesFollowTheZeroTable) {
  const double n = static_cast<double>(small_config().num_parameters());
  for (int world : {2, 4}) {
    for (int stage : {1, 2, 3}) {
      SCOPED_TRACE("world " + std::to_string(world) + " stage " + std::to_string(stage));
      ZeroBehaviour behaviour;
      behaviour.prefetch_bucket_size = 0;  // stage 3: one unit gathered at a time
      const TrainingRun run =
          zero_run(world, ZeroOptions().stage(stage).behaviour(behaviour), 1);
      const FSDPMemory& m = run.memory;
      // fp32 with Adam (the ZeRO paper's table with K = 8 and no separate fp16 copy):
      // stage 1: 4N parameters + 4N gradients + 8N/W optimizer state; stage 2: 4N + 12N/W;
      // stage 3: 16N/W plus the gathered root and one unit.
      const double expected = stage == 1   ? 8 * n + 8 * n / world
                              : stage == 2 ? 4 * n + 12 * n / world
                                           : 16 * n / world + static_cast<double>(
                                                                  m.root_unit + m.largest_unit);
      const double measured = static_cast<double>(m.param_shards + m.grad_shards +
                                                  run.optimizer_bytes + m.gathered_peak);
      EXPECT_LE(std::abs(measured - expected) / expected, 0.10)
          << "measured " << measured << " expected " << expected;
    }
  }
}

// The largest distance between two fp32 tensors' elements in representable floats.
int64_t ulps_apart(const at::Tensor& a, const at::Tensor& b) {
  const auto bits = [](const at::Tensor& t) {
    const at::Tensor i = t.contiguous().to(at::kFloat).view(at::kInt).to(at::kLong);
    // Floats ordered as integers: negative ones mirrored below zero.
    return at::where(i < 0, -(i & 0x7fffffff), i);
  };
  return (bits(a) - bits(b)).abs().max().item<int64_t>();
}

TEST(Zero, ParameterShardsInFilesTrainExactlyAsInMemory) {
  const auto dir = fresh_test_dir("shardtrain_zero_param_nvme");
  const auto bf16 = MixedPrecision().param_dtype(at::kBFloat16).reduce_dtype(at::kFloat);
  for (const bool half : {false, true}) {
    SCOPED_TRACE(half ? "bf16 parameters" : "fp32");
    ZeroOptions in_memory = ZeroOptions().stage(3);
    if (half) in_memory.mixed_precision(bf16);
    const TrainingRun want = zero_run(4, in_memory, 5);
    const int64_t units = small_config().n_layers + 1;
    ZeroOptions on_file = in_memory;
    on_file.offload_param(OffloadDevice::kNvme).nvme_path(dir.string());
    const TrainingRun run = sharded_by(
        4, 1,
        [&](Transformer model, const DeviceMesh& mesh) {
          auto zero = zero_shard(model, mesh, on_file);
          // Between uses the shards are in files, one per unit, not in memory.
          int64_t files = 0;
          for (const auto& entry : std::filesystem::directory_iterator(dir)) {
            files += entry.path().filename().string().rfind("shardtrain_param_", 0) == 0;
          }
          EXPECT_GE(files, units);
          EXPECT_EQ(zero->memory().param_shards, 0);
          return zero;
        },
        5);
    // The round trip through the files is exact: the same losses and parameters, bit for bit.
    EXPECT_EQ(run.losses, want.losses);
    bool all_equal = true;
    for (const auto& [name, value] : want.params) {
      const bool equal = run.params.at(name).equal(value);
      all_equal = all_equal && equal;
      EXPECT_TRUE(equal) << name << ": at most " << ulps_apart(run.params.at(name), value)
                         << " float steps apart";
    }
    if (!all_equal) {
      // Whether training in memory repeats itself bit for bit on this machine: if it does not,
      // the difference is the kernels' rounding, not the files.
      const TrainingRun again = zero_run(4, in_memory, 5);
      int64_t worst = 0;
      for (const auto& [name, value] : want.params)
        worst = std::max(worst, ulps_apart(again.params.at(name), value));
      ADD_FAILURE() << "a second run in memory is " << worst
                    << " float steps from the first at most (0: training in memory repeats "
                       "exactly here, so the files changed the result)";
    }
    EXPECT_EQ(run.memory.param_shards, 0);
    // In memory, bf16 adds a 2-byte copy of each 4-byte master element to the shards.
    const int64_t master_bytes = half ? want.memory.param_shards / 6 * 4 : want.memory.param_shards;
    EXPECT_EQ(run.memory.param_shards_on_file, master_bytes);
    EXPECT_TRUE(std::filesystem::is_empty(dir));  // removed with the wrapper
  }
  std::filesystem::remove_all(dir);
}

TEST(Zero, GradientShardsInFilesTrainExactlyAsInMemory) {
  // offload_optimizer = nvme at stages 2 and 3 keeps the gradient shards in files between
  // backward and the step: reductions read, add and write them; clipping uses the sums of
  // squares kept from the writes and scales as the shards are read.
  const auto dir = fresh_test_dir("shardtrain_zero_grad_nvme");
  for (const int stage : {2, 3}) {
    for (const int micro : {1, 2}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + ", " + std::to_string(micro) +
                   " micro-batches");
      const TrainingRun want = zero_run(4, ZeroOptions().stage(stage), 4, micro);
      ZeroOptions on_file = ZeroOptions().stage(stage);
      on_file.offload_optimizer(OffloadDevice::kNvme).nvme_path(dir.string());
      if (stage == 3) on_file.offload_param(OffloadDevice::kNvme);
      const TrainingRun run = zero_run(4, on_file, 4, micro);
      EXPECT_EQ(run.losses, want.losses);
      for (const auto& [name, value] : want.params) {
        EXPECT_TRUE(run.params.at(name).equal(value)) << name;
      }
      EXPECT_EQ(run.memory.grad_shards, 0);
      EXPECT_EQ(run.memory.grad_shards_on_file, want.memory.grad_shards);
      EXPECT_TRUE(std::filesystem::is_empty(dir));
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(Zero, AShardFileCutShortFailsTheStepNamingIt) {
  // Shards in files are read ahead on an I/O thread: a read that fails there (a file truncated
  // behind the run's back) must fail the step on the training thread, naming the file, and
  // the wrapper must still go away cleanly.
  const auto dir = fresh_test_dir("shardtrain_zero_cut_short");
  run_local_ranks(1, [&](ProcessGroup& group) {
    auto shared = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
    DeviceMesh mesh(shared, MeshShape());
    Transformer model = make_model(small_config());
    const ZeroOptions options = ZeroOptions()
                                    .stage(3)
                                    .offload_param(OffloadDevice::kNvme)
                                    .offload_optimizer(OffloadDevice::kNvme)
                                    .nvme_path(dir.string());
    auto zero = zero_shard(model, mesh, options);
    // One step through the files works.
    zero->zero_grad();
    loss_of(model, tokens(0)).backward();
    EXPECT_TRUE(zero->grads_finite());
    std::string cut;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("shardtrain_param_", 0) == 0 && name.find("blocks.2") != std::string::npos) {
        cut = entry.path().string();
      }
    }
    ASSERT_FALSE(cut.empty());
    std::filesystem::resize_file(cut, 16);
    zero->zero_grad();
    try {
      loss_of(model, tokens(1)).backward();
      ADD_FAILURE() << "a step over a truncated shard file ran";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(cut), std::string::npos) << e.what();
    }
  });
  EXPECT_TRUE(std::filesystem::is_empty(dir));  // the files went with the wrapper
  std::filesystem::remove_all(dir);
}

TEST(Zero, UnsupportedSettingsAreClearErrors) {
  run_local_ranks(1, [&](ProcessGroup& group) {
    auto shared = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
    DeviceMesh mesh(shared, MeshShape());
    auto message = [&](ZeroOptions options) {
      try {
        zero_shard(make_model(small_config()), mesh, options);
      } catch (const std::invalid_argument& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    };
    EXPECT_NE(message(ZeroOptions().stage(4)).find("stage must be 1, 2 or 3"), std::string::npos);
    EXPECT_NE(message(ZeroOptions().stage(2).offload_param(OffloadDevice::kCpu))
                  .find("offload_param needs stage 3"),
              std::string::npos);
    EXPECT_NE(message(ZeroOptions().stage(3).offload_optimizer(OffloadDevice::kNvme))
                  .find("offload_optimizer = nvme needs nvme_path"),
              std::string::npos);
    EXPECT_NE(message(ZeroOptions().stage(3).offload_param(OffloadDevice::kNvme))
                  .find("offload_param = nvme needs nvme_path"),
              std::string::npos);
    EXPECT_NE(message(ZeroOptions().stage(3).offload_param(OffloadDevice::kNvme).nvme_path(
                  "/nonexistent/shardtrain"))
                  .find("'/nonexistent/shardtrain' does not exist"),
              std::string::npos);
    // Gradient shards in files: a directory that is missing, or ZeRO-1's whole gradients.
    EXPECT_NE(message(ZeroOptions().stage(2).offload_optimizer(OffloadDevice::kNvme).nvme_path(
                  "/nonexistent/shardtrain"))
                  .find("gradient shards '/nonexistent/shardtrain' does not exist"),
              std::string::npos);
    try {
      FullyShardedDataParallel(make_model(small_config()), mesh,
                               FSDPOptions().zero([] {
                                 ZeroBehaviour b;
                                 b.stage = 1;
                                 return b;
                               }()).grad_swap_dir(std::filesystem::temp_directory_path()));
      ADD_FAILURE() << "ZeRO-1 with gradient shards in files was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("stage 1 keeps whole gradients"), std::string::npos)
          << e.what();
    }
    try {
      FullyShardedDataParallel(make_model(small_config()), mesh,
                               FSDPOptions()
                                   .sharding(ShardingStrategy::kShardGradOp)
                                   .param_swap_dir(std::filesystem::temp_directory_path()));
      ADD_FAILURE() << "shard_grad_op with parameter shards in files was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("need full_shard sharding"), std::string::npos)
          << e.what();
    }
  });
}

}  // namespace zero_test
}  // namespace shardtrain
