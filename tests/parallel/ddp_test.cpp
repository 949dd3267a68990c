#include "shardtrain/ddp.h"

#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <cmath>

#include "shardtrain/rendezvous.h"

namespace shardtrain {
namespace ddp_test {

constexpr int64_t kGlobalBatch = 16;

std::shared_ptr<torch::nn::SequentialImpl> make_mlp() {
  return torch::nn::Sequential(torch::nn::Linear(8, 32), torch::nn::Tanh(),
                               torch::nn::Linear(32, 32), torch::nn::Tanh(),
                               torch::nn::Linear(32, 4))
      .ptr();
}

// Deterministic weights and data that need no random generator (ranks are threads sharing it).
void fill(torch::nn::Module& module, double salt) {
  torch::NoGradGuard no_grad;
  double k = salt;
  for (auto& p : module.parameters()) {
    p.copy_(at::sin(at::arange(p.numel(), at::kDouble) * 0.37 + (k += 1.0)).view_as(p) * 0.3);
  }
}
at::Tensor inputs() {
  return at::cos(at::arange(kGlobalBatch * 8, at::kFloat) * 0.11).view({kGlobalBatch, 8});
}
at::Tensor targets() {
  return at::sin(at::arange(kGlobalBatch * 4, at::kFloat) * 0.23).view({kGlobalBatch, 4});
}

struct TrainingRun {
  std::vector<double> losses;
  std::vector<at::Tensor> params;
};

// Single-process training on the whole global batch.
TrainingRun reference(int steps) {
  auto model = make_mlp();
  fill(*model, 0.0);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  TrainingRun run;
  for (int s = 0; s < steps; ++s) {
    sgd.zero_grad();
    at::Tensor loss = (model->forward(inputs()) - targets()).pow(2).mean();
    loss.backward();
    sgd.step();
    run.losses.push_back(loss.item<double>());
  }
  for (const auto& p : model->parameters()) run.params.push_back(p.detach().clone());
  return run;
}

// The same under DDP on `world` ranks; each rank's batch slice is split into `micro` micro-
// batches, all but the last under no_sync.
TrainingRun distributed(int world, int steps, DDPOptions options, int micro = 1) {
  TrainingRun result;
  run_local_ranks(
      world,
      [&](ProcessGroup& group) {
        auto model = make_mlp();
        fill(*model, 10.0 * group.rank());  // differs per rank: DDP must broadcast rank 0's
        if (group.rank() == 0) fill(*model, 0.0);
        auto shared = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
        DistributedDataParallel ddp(model, shared, options);
        torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
        const int64_t per_rank = kGlobalBatch / world;
        const int64_t per_micro = per_rank / micro;
        for (int s = 0; s < steps; ++s) {
          sgd.zero_grad();
          double local = 0;
          for (int m = 0; m < micro; ++m) {
            const int64_t begin = group.rank() * per_rank + m * per_micro;
            at::Tensor loss = (model->forward(inputs().narrow(0, begin, per_micro)) -
                               targets().narrow(0, begin, per_micro))
                                  .pow(2)
                                  .mean() /
                              micro;
            if (m + 1 < micro) {
              auto guard = ddp.no_sync();
              loss.backward();
            } else {
              loss.backward();
            }
            local += loss.item<double>();
          }
          sgd.step();
          at::Tensor global = at::tensor(local, at::kDouble);
          group.all_reduce(global, ReduceOp::kAvg)->wait();
          if (group.rank() == 0) result.losses.push_back(global.item<double>());
        }
        if (group.rank() == 0) {
          for (const auto& p : model->parameters()) result.params.push_back(p.detach().clone());
        }
      },
      ProcessGroupOptions().timeout(std::chrono::seconds(60)));
  return result;
}

void expect_equivalent(const TrainingRun& a, const TrainingRun& b, double tolerance) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) {
    EXPECT_NEAR(a.losses[i], b.losses[i], tolerance * std::abs(a.losses[i])) << "step " << i;
  }
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) {
    const double scale = a.params[i].abs().max().item<double>();
    EXPECT_LE((a.params[i] - b.params[i]).abs().max().item<double>(), tolerance * scale)
        << "parameter " << i;
  }
}

class DdpEquivalence : public ::testing::TestWithParam<int> {};

TEST_P(DdpEquivalence, TenStepsMatchSingleProcessTraining) {
  // Tiny buckets: several all-reduces per backward.
  expect_equivalent(
      reference(10),
      distributed(GetParam(), 10, DDPOptions().bucket_cap_mb(0.004).first_bucket_cap_mb(0.001)),
      1e-5);
}

TEST_P(DdpEquivalence, NoSyncAccumulationMatchesToo) {
  expect_equivalent(reference(10), distributed(GetParam(), 10, DDPOptions(), /*micro=*/2), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Worlds, DdpEquivalence, ::testing::Values(2, 4));

TEST(DdpTest, BucketsFillInBackwardOrderAndGradientsAreViews) {
  run_local_ranks(
      2,
      [](ProcessGroup& group) {
        auto model = make_mlp();
        fill(*model, 0.0);
        DistributedDataParallel ddp(model,
                                    std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {}),
                                    DDPOptions().bucket_cap_mb(0.004).first_bucket_cap_mb(0.0002));
        // Reverse registration order (the last layer's gradients come first); a bucket closes
        // with the parameter that brings it to its cap (209 bytes for the first, 4194 after):
        // 4.weight is 512 bytes, 2.bias + 2.weight 4224.
        const std::vector<std::vector<std::string>> expected = {
            {"4.bias", "4.weight"}, {"2.bias", "2.weight"}, {"0.bias", "0.weight"}};
        const auto layout = ddp.bucket_layout();
        EXPECT_EQ(layout, expected);
        // Parameters of one bucket share its storage: gradients are views, not copies.
        const auto params = model->named_parameters();
        for (const auto& bucket : layout) {
          for (const auto& name : bucket) {
            EXPECT_TRUE(params[name].grad().is_alias_of(params[bucket.front()].grad())) << name;
          }
        }
        at::Tensor loss = model->forward(inputs()).pow(2).mean();
        loss.backward();
        const DDPTimeline& timeline = ddp.last_timeline();
        EXPECT_EQ(timeline.buckets.size(), layout.size());
        for (const auto& b : timeline.buckets) {
          EXPECT_GE(b.start, b.launched);
          EXPECT_GE(b.end, b.start);
        }
        EXPECT_GE(timeline.finished, timeline.last_gradient);
      },
      ProcessGroupOptions().timeout(std::chrono::seconds(60)));
}

// A module with a parameter its forward never uses.
struct WithUnused : torch::nn::Module {
  WithUnused() {
    used = register_module("used", torch::nn::Linear(8, 4));
    unused = register_module("unused", torch::nn::Linear(8, 4));
  }
  at::Tensor forward(const at::Tensor& x) { return used->forward(x); }
  torch::nn::Linear used{nullptr}, unused{nullptr};
};

TEST(DdpTest, UnusedParameterNeedsFindUnusedParameters) {
  std::vector<std::string> errors(2);
  run_local_ranks(
      2,
      [&](ProcessGroup& group) {
        auto shared = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
        {
          auto model = std::make_shared<WithUnused>();
          DistributedDataParallel ddp(model, shared);
          try {
            model->forward(inputs()).pow(2).mean().backward();
          } catch (const std::exception& e) {
            errors[group.rank()] = e.what();
          }
        }
        auto model = std::make_shared<WithUnused>();
        fill(*model, 0.0);
        DistributedDataParallel ddp(model, shared, DDPOptions().find_unused_parameters(true));
        torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
        const at::Tensor unused_before = model->unused->weight.detach().clone();
        for (int s = 0; s < 3; ++s) {
          sgd.zero_grad();
          model->forward(inputs().narrow(0, group.rank() * 8, 8)).pow(2).mean().backward();
          sgd.step();
        }
        EXPECT_TRUE(at::equal(model->unused->weight, unused_before));
        EXPECT_FALSE(at::equal(model->used->weight.grad(), at::zeros_like(model->used->weight)));
      },
      ProcessGroupOptions().timeout(std::chrono::seconds(60)));
  for (const auto& error : errors) {
    EXPECT_NE(error.find("unused.weight"), std::string::npos) << error;
    EXPECT_NE(error.find("find_unused_parameters(true)"), std::string::npos) << error;
  }
}

TEST(DdpTest, CompressionHooksStayCloseToFullPrecision) {
  const TrainingRun exact = reference(5);
  expect_equivalent(exact, distributed(2, 5, DDPOptions().comm_hook(DDPCommHook::kBf16Compress)),
                    2e-2);
  expect_equivalent(exact, distributed(2, 5, DDPOptions().comm_hook(DDPCommHook::kFp16Compress)),
                    2e-3);
}

}  // namespace ddp_test
}  // namespace shardtrain
