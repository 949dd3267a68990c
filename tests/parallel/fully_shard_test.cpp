// fully_shard on a module the library knows nothing about: training at 1 to 4 ranks, under every
// sharding and ZeRO stage, matches one process; its shards save and load at any world size;
// wrong uses are refused with a message naming the module or parameter.
#include "shardtrain/fully_shard.h"

#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include <cmath>
#include <filesystem>

#include "shardtrain/rendezvous.h"
#include "support.h"

namespace shardtrain {
namespace fully_shard_test {

constexpr int64_t kGlobalBatch = 12;  // divisible by 1, 2, 3 and 4 ranks

// A block with a 1-D parameter, and optionally a frozen one.
struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t in, int64_t out, bool frozen_bias) {
    fc = register_module("fc", torch::nn::Linear(in, out));
    scale = register_parameter("scale", at::ones({out}));
    if (frozen_bias) bias = register_parameter("bias", at::zeros({out}), /*requires_grad=*/false);
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor y = at::tanh(fc(x)) * scale;
    return bias.defined() ? y + bias : y;
  }
  torch::nn::Linear fc{nullptr};
  at::Tensor scale, bias;
};
TORCH_MODULE(Block);

// Sizes that no rank count divides, a frozen matrix in the root, a buffer.
struct NetImpl : torch::nn::Module {
  NetImpl() {
    input = register_module("input", torch::nn::Linear(6, 10));
    b1 = register_module("b1", Block(10, 7, false));
    b2 = register_module("b2", Block(7, 9, true));
    project = register_parameter("project", at::zeros({5, 9}), /*requires_grad=*/false);
    head = register_module("head", torch::nn::Linear(5, 3));
    shift = register_buffer("shift", at::zeros({3}));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = input(x);
    h = call(b1, h);
    h = call(b2, h);
    return head(h.matmul(project.t())) + shift;
  }
  torch::nn::Linear input{nullptr}, head{nullptr};
  Block b1{nullptr}, b2{nullptr};
  at::Tensor project, shift;
};
TORCH_MODULE(Net);

Net make_net() {
  Net net;
  torch::NoGradGuard no_grad;
  double k = 0;
  for (auto& p : net->parameters()) {
    p.copy_(at::sin(at::arange(p.numel(), at::kDouble) * 0.37 + (k += 1.0)).view_as(p) * 0.4);
  }
  net->shift.copy_(at::arange(3, at::kFloat) * 0.1);
  return net;
}

at::Tensor inputs() {
  return at::cos(at::arange(kGlobalBatch * 6, at::kFloat) * 0.11).view({kGlobalBatch, 6});
}
at::Tensor targets() {
  return at::sin(at::arange(kGlobalBatch * 3, at::kFloat) * 0.23).view({kGlobalBatch, 3});
}

constexpr double kClip = 0.5;  // below the first steps' gradient norm: clipping is active

struct TrainingRun {
  std::vector<double> losses;
  std::vector<std::pair<std::string, at::Tensor>> state;
};

TrainingRun reference(int steps) {
  Net net = make_net();
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(0.02).weight_decay(0.1));
  TrainingRun run;
  for (int s = 0; s < steps; ++s) {
    adamw.zero_grad();
    at::Tensor loss = (call(net, inputs()) - targets()).pow(2).mean();
    loss.backward();
    std::vector<at::Tensor> trainable;
    for (auto& p : net->parameters()) {
      if (p.requires_grad()) trainable.push_back(p);
    }
    torch::nn::utils::clip_grad_norm_(trainable, kClip);
    adamw.step();
    run.losses.push_back(loss.item<double>());
  }
  for (const auto& item : net->named_parameters()) run.state.emplace_back(item.key(), item.value());
  for (const auto& item : net->named_buffers()) run.state.emplace_back(item.key(), item.value());
  return run;
}

// The mesh dp_replicate x dp_shard over the ranks of `group` (a thread's group, not owned).
DeviceMesh mesh_of(ProcessGroup& group, int replicate = 1) {
  auto world = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
  return DeviceMesh(world, resolve_mesh(MeshShape().dp_replicate(replicate), group.size()));
}

// fully_shard on b1 and b2, then on the root, as a user applies it.
struct ShardedNet {
  std::shared_ptr<FSDPModule> b1, b2, root;
};
ShardedNet shard_blocks_then_root(Net& net, const DeviceMesh& mesh,
                                  const FullyShardOptions& options = {}) {
  ShardedNet out;
  out.b1 = fully_shard(net->b1.ptr(), mesh, options);
  out.b2 = fully_shard(net->b2.ptr(), mesh, options);
  out.root = fully_shard(net.ptr(), mesh, options);
  return out;
}

struct ShardSetup {
  int world = 1;
  int replicate = 1;
  FullyShardOptions options;
  int micro = 1;              // micro-batches per step, all but the last without gradient sync
  bool explicit_prefetch = false;
};

// Shards b1, b2, then the root, and trains; rank 0 reports the losses and full state.
TrainingRun sharded(const ShardSetup& setup, int steps,
            const std::function<void(FSDPModule&, ProcessGroup&)>& after = nullptr) {
  TrainingRun run;
  run_local_ranks(
      setup.world,
      [&](ProcessGroup& group) {
        Net net = make_net();
        if (group.rank() != 0) {
          // Different values elsewhere: the shards must come from rank 0's.
          torch::NoGradGuard no_grad;
          for (auto& p : net->parameters()) p.add_(1.0);
        }
        auto [b1, b2, root] =
            shard_blocks_then_root(net, mesh_of(group, setup.replicate), setup.options);
        if (setup.explicit_prefetch) {
          b1->set_modules_to_forward_prefetch({b2});
          b2->set_modules_to_backward_prefetch({b1});
        }
        torch::optim::AdamW adamw(root->parameters(),
                                  torch::optim::AdamWOptions(0.02).weight_decay(0.1));
        const int64_t per_rank = kGlobalBatch / setup.world;
        const int64_t per_micro = per_rank / setup.micro;
        for (int s = 0; s < steps; ++s) {
          adamw.zero_grad();
          double local = 0;
          for (int m = 0; m < setup.micro; ++m) {
            const bool last = m + 1 == setup.micro;
            root->set_requires_gradient_sync(last);
            root->set_reshard_after_backward(last);
            const int64_t begin = group.rank() * per_rank + m * per_micro;
            at::Tensor loss = (call(net, inputs().narrow(0, begin, per_micro)) -
                               targets().narrow(0, begin, per_micro))
                                  .pow(2)
                                  .mean() /
                              setup.micro;
            loss.backward();
            local += loss.item<double>();
          }
          root->clip_grad_norm(kClip);
          adamw.step();
          at::Tensor global = at::tensor(local, at::kDouble);
          group.all_reduce(global, ReduceOp::kAvg)->wait();
          if (group.rank() == 0) run.losses.push_back(global.item<double>());
        }
        auto state = root->full_state_dict();
        if (group.rank() == 0) run.state = state;
        if (after) after(*root, group);
      },
      ProcessGroupOptions().timeout(std::chrono::seconds(60)));
  return run;
}

void expect_equivalent(const TrainingRun& want, const TrainingRun& got, double tolerance) {
  ASSERT_EQ(want.losses.size(), got.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], want.losses[i], tolerance * std::abs(want.losses[i])) << "step " << i;
  }
  ASSERT_EQ(want.state.size(), got.state.size());
  for (const auto& [name, value] : want.state) {
    const at::Tensor* found = nullptr;
    for (const auto& item : got.state) {
      if (item.first == name) found = &item.second;
    }
    ASSERT_NE(found, nullptr) << name;
    ASSERT_EQ(found->sizes(), value.sizes()) << name;
    const double scale = std::max(1e-3, value.abs().max().item<double>());
    EXPECT_LE((*found - value).abs().max().item<double>(), tolerance * scale) << name;
  }
}

struct Case {
  const char* name;
  int world;
  int replicate;
  int zero_stage;
  bool reshard_after_forward;
};

class FullyShardEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(FullyShardEquivalence, TenStepsMatchOneProcess) {
  const Case c = GetParam();
  ShardSetup setup;
  setup.world = c.world;
  setup.replicate = c.replicate;
  setup.options = FullyShardOptions().reshard_after_forward(c.reshard_after_forward).zero_stage(c.zero_stage);
  expect_equivalent(reference(10), sharded(setup, 10), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, FullyShardEquivalence,
    ::testing::Values(Case{"full_shard_1", 1, 1, 0, true}, Case{"full_shard_2", 2, 1, 0, true},
                      Case{"full_shard_3", 3, 1, 0, true}, Case{"full_shard_4", 4, 1, 0, true},
                      Case{"shard_grad_op_1", 1, 1, 0, false},
                      Case{"shard_grad_op_2", 2, 1, 0, false},
                      Case{"shard_grad_op_3", 3, 1, 0, false},
                      Case{"shard_grad_op_4", 4, 1, 0, false}, Case{"hybrid_4", 4, 2, 0, true},
                      Case{"replicated_2", 2, 2, 0, true},
                      Case{"zero1_2", 2, 1, 1, true}, Case{"zero1_3", 3, 1, 1, true},
                      Case{"zero2_2", 2, 1, 2, true}, Case{"zero2_4", 4, 1, 2, true},
                      Case{"zero3_3", 3, 1, 3, false}, Case{"zero3_4", 4, 1, 3, false}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

TEST(FullyShardTest, AccumulationWithoutSyncAndExplicitPrefetchMatchToo) {
  ShardSetup setup;
  setup.world = 2;
  setup.micro = 3;
  expect_equivalent(reference(10), sharded(setup, 10), 1e-5);
  setup.micro = 1;
  setup.explicit_prefetch = true;
  expect_equivalent(reference(10), sharded(setup, 10), 1e-5);
}

TEST(FullyShardTest, Bf16ComputeStaysCloseToFp32) {
  ShardSetup setup;
  setup.world = 2;
  setup.options.mixed_precision(MixedPrecision().param_dtype(at::kBFloat16));
  const TrainingRun want = reference(5);
  const TrainingRun got = sharded(setup, 5);
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], want.losses[i], 0.03 * want.losses[i]) << "step " << i;
    if (i > 0) {
      EXPECT_NE(got.losses[i], want.losses[i]);  // bf16 really was used
    }
  }
}

TEST(FullyShardTest, CheckpointSavedAtTwoRanksLoadsAtThree) {
  const auto dir = testing::fresh_test_dir("fully_shard_ckpt");
  ShardSetup two;
  two.world = 2;
  const TrainingRun saved = sharded(two, 3, [&](FSDPModule& root, ProcessGroup& group) {
    auto [tensors, slices] = root.checkpoint_slices();
    save_sharded_checkpoint(dir.string(), "step_3", tensors, slices, &group);
  });
  run_local_ranks(3, [&](ProcessGroup& group) {
    Net net = make_net();
    auto root = shard_blocks_then_root(net, mesh_of(group)).root;
    root->load_checkpoint(ShardedCheckpointReader((dir / "step_3").string()));
    const auto state = root->full_state_dict();
    if (group.rank() != 0) return;
    TrainingRun loaded;
    loaded.state = state;
    loaded.losses = saved.losses;
    expect_equivalent(saved, loaded, 0.0);
  });
  std::filesystem::remove_all(dir);
}

// The message of the std::invalid_argument `f` throws on rank 0 of one rank.
std::string refusal(const std::function<void(const DeviceMesh&)>& f) {
  std::string message;
  run_local_ranks(1, [&](ProcessGroup& group) {
    try {
      f(mesh_of(group));
    } catch (const std::invalid_argument& e) {
      message = e.what();
    }
  });
  return message;
}

TEST(FullyShardTest, WrongUsesAreRefusedNamingWhatIsWrong) {
  EXPECT_NE(refusal([](const DeviceMesh& mesh) {
              auto empty = std::make_shared<torch::nn::Module>("Empty");
              fully_shard(empty, mesh);
            }).find("has no parameters"),
            std::string::npos);
  EXPECT_NE(refusal([](const DeviceMesh& mesh) {
              Net net = make_net();
              auto first = fully_shard(net->b1.ptr(), mesh);
              fully_shard(net->b1.ptr(), mesh);
            }).find("is sharded already"),
            std::string::npos);
  const std::string parent_first = refusal([](const DeviceMesh& mesh) {
    Net net = make_net();
    auto root = fully_shard(net.ptr(), mesh);
    fully_shard(net->b2.ptr(), mesh);
  });
  EXPECT_NE(parent_first.find("'b2'"), std::string::npos) << parent_first;
  EXPECT_NE(parent_first.find("children first"), std::string::npos) << parent_first;
  const std::string shared = refusal([](const DeviceMesh& mesh) {
    Net net = make_net();
    net->head->weight = net->register_parameter("tied", net->head->weight);  // also the root's
    auto head = fully_shard(net->head.ptr(), mesh);
    fully_shard(net.ptr(), mesh);
  });
  EXPECT_NE(shared.find("parameter 'tied'"), std::string::npos) << shared;
  EXPECT_NE(shared.find("common parent"), std::string::npos) << shared;
}

TEST(FullyShardTest, ABlockCalledOutsideItsParentsForwardIsAnError) {
  run_local_ranks(1, [&](ProcessGroup& group) {
    Net net = make_net();
    const ShardedNet sharded = shard_blocks_then_root(net, mesh_of(group));
    // The block alone, not inside call(net, ...): its parent's parameters were never gathered.
    try {
      call(net->b1, at::ones({2, 10}));
      ADD_FAILURE() << "no error";
    } catch (const std::logic_error& e) {
      EXPECT_NE(std::string(e.what()).find("shardtrain::call"), std::string::npos) << e.what();
    }
  });
}

TEST(FullyShardTest, ParametersHaveMemoryOnlyWhileTheirModuleNeedsThem) {
  for (const bool reshard : {true, false}) {
    run_local_ranks(2, [&](ProcessGroup& group) {
      Net net = make_net();
      auto root = shard_blocks_then_root(net, mesh_of(group),
                                         FullyShardOptions().reshard_after_forward(reshard))
                      .root;
      EXPECT_FALSE(is_materialized(net->b1->fc->weight));
      EXPECT_FALSE(is_materialized(net->head->weight));
      at::Tensor loss = call(net, inputs()).pow(2).mean();
      // After forward: a block is gathered again only for its backward under full_shard; the
      // root stays gathered for the start of backward.
      EXPECT_EQ(is_materialized(net->b1->fc->weight), !reshard);
      EXPECT_TRUE(is_materialized(net->head->weight));
      loss.backward();
      EXPECT_FALSE(is_materialized(net->b1->fc->weight));
      EXPECT_FALSE(is_materialized(net->b2->fc->weight));
      EXPECT_FALSE(is_materialized(net->head->weight));
      // The shard holds this rank's rows: 7 rows over 2 ranks is 4 and 3.
      for (const auto& p : root->sharded_parameters()) {
        if (p.name == "b1.fc.weight") {
          EXPECT_EQ(p.local.size(0), group.rank() == 0 ? 4 : 3);
        }
      }
    });
  }
}

TEST(FullyShardTest, ParameterSharedInsideOneShardedModuleIsShardedOnce) {
  run_local_ranks(2, [&](ProcessGroup& group) {
    Net net = make_net();
    net->register_parameter("tied", net->head->weight);
    auto root = fully_shard(net.ptr(), mesh_of(group));
    int heads = 0;
    for (const auto& p : root->sharded_parameters()) heads += p.name == "head.weight" || p.name == "tied";
    EXPECT_EQ(heads, 1);
    at::Tensor loss = call(net, inputs()).pow(2).mean();
    loss.backward();
    EXPECT_TRUE(std::isfinite(loss.item<double>()));
  });
}

}  // namespace fully_shard_test
}  // namespace shardtrain
