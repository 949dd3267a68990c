// Progressive layer dropping: the schedule of the share kept (DeepSpeed's theta), the draw
// (each block kept at its probability, the same for the same step and seed), and the model
// under set_layer_drop: a skipped block is the model without it, a kept one's residual branches
// are scaled (the same as scaling their output projections), and evaluation runs every block.
#include "train/layer_drop.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "shardtrain/model.h"

namespace shardtrain {
namespace layer_drop_test {

TrainSection progressive(double theta, double gamma) {
  TrainSection train;
  train.layer_drop = "progressive";
  train.layer_drop_theta = theta;
  train.layer_drop_gamma = gamma;
  return train;
}

TEST(LayerDropSchedule, ThetaFallsFromOneAsDeepSpeedsEngineUpdatesIt) {
  const TrainSection train = progressive(0.5, 0.01);
  // The first two steps keep every block (DeepSpeed's first update is from step count 0).
  EXPECT_EQ(detail::layer_drop_theta(train, 0), 1.0);
  EXPECT_EQ(detail::layer_drop_theta(train, 1), 1.0);
  for (int64_t completed : {2, 10, 300}) {
    EXPECT_DOUBLE_EQ(detail::layer_drop_theta(train, completed),
                     0.5 + 0.5 * std::exp(-0.01 * static_cast<double>(completed - 1)));
  }
  EXPECT_NEAR(detail::layer_drop_theta(train, 100000), 0.5, 1e-12);
  // Until theta falls below 1 no block is dropped or scaled.
  EXPECT_EQ(detail::layer_drop_scales(train, 1, 4, 7), std::vector<double>(4, 1.0));
}

TEST(LayerDropSchedule, EachBlockIsKeptAtItsProbabilityTheSameOnEveryCall) {
  const TrainSection train = progressive(0.4, 1e9);  // theta = 0.4 from the third step on
  const int64_t layers = 4, steps = 4000;
  std::vector<int64_t> kept(layers, 0);
  for (int64_t step = 2; step < 2 + steps; ++step) {
    const std::vector<double> scales = detail::layer_drop_scales(train, step, layers, 1234);
    ASSERT_EQ(scales, detail::layer_drop_scales(train, step, layers, 1234));
    for (int64_t l = 0; l < layers; ++l) {
      const double keep = 1.0 - static_cast<double>(l + 1) / layers * 0.6;
      const double s = scales[static_cast<size_t>(l)];
      ASSERT_TRUE(s == 0.0 || std::abs(s - 1.0 / keep) < 1e-12) << s;
      kept[static_cast<size_t>(l)] += s > 0.0;
    }
  }
  for (int64_t l = 0; l < layers; ++l) {
    const double keep = 1.0 - static_cast<double>(l + 1) / layers * 0.6;
    // Binomial(4000, keep): 4 standard deviations are below 0.032.
    EXPECT_NEAR(static_cast<double>(kept[static_cast<size_t>(l)]) / steps, keep, 0.032) << l;
  }
  EXPECT_NE(detail::layer_drop_scales(train, 5, 16, 1234),
            detail::layer_drop_scales(train, 5, 16, 1235));
}

// The tiny GPT-2 (2 blocks) in double, and its tokens.
Transformer tiny_model(int64_t layers = 2) {
  torch::manual_seed(3);
  ModelConfig c = model_preset("tiny");
  c.n_layers = layers;
  Transformer model(c);
  model->to(at::kDouble);
  return model;
}

void copy_parameters(Transformer& from, Transformer& to) {
  torch::NoGradGuard no_grad;
  const auto source = from->named_parameters();
  for (auto& item : to->named_parameters()) item.value().copy_(source[item.key()]);
}

TEST(LayerDropModel, ASkippedBlockIsTheModelWithoutIt) {
  Transformer model = tiny_model();
  Transformer first_only = tiny_model(1);
  copy_parameters(model, first_only);  // the blocks' names are shared; block 1 has no twin
  const at::Tensor tokens = torch::randint(model->config().vocab_size, {2, 9});
  torch::NoGradGuard no_grad;
  model->train();
  first_only->train();
  const at::Tensor whole = model->forward(tokens);
  model->set_layer_drop({1.0, 0.0});
  EXPECT_TRUE(torch::allclose(model->forward(tokens), first_only->forward(tokens), 0, 1e-12));
  // Evaluation runs every block.
  model->eval();
  EXPECT_TRUE(torch::allclose(model->forward(tokens), whole, 0, 1e-12));
  model->train();
  model->set_layer_drop({});
  EXPECT_TRUE(torch::allclose(model->forward(tokens), whole, 0, 1e-12));
  EXPECT_THROW(model->set_layer_drop({1.0, 1.0, 1.0}), std::invalid_argument);
}

TEST(LayerDropModel, AKeptBlockScalesItsResidualBranches) {
  Transformer model = tiny_model();
  Transformer scaled = tiny_model();
  copy_parameters(model, scaled);
  {
    // Both residual branches of block 0 end in a projection: doubling its weight and bias
    // doubles the branch.
    torch::NoGradGuard no_grad;
    for (const char* name : {"blocks.0.attn.proj.weight", "blocks.0.attn.proj.bias",
                             "blocks.0.mlp.proj.weight", "blocks.0.mlp.proj.bias"}) {
      auto* p = scaled->named_parameters().find(name);
      ASSERT_NE(p, nullptr) << name;
      p->mul_(2.0);
    }
  }
  const at::Tensor tokens = torch::randint(model->config().vocab_size, {2, 9});
  model->train();
  scaled->train();
  model->set_layer_drop({2.0, 1.0});
  const at::Tensor got = model->forward(tokens);
  const at::Tensor want = scaled->forward(tokens);
  EXPECT_TRUE(torch::allclose(got, want, 0, 1e-10));
  // And the gradient reaches the parameters of the scaled block as the doubled one's does.
  got.sum().backward();
  want.sum().backward();
  const auto a = model->named_parameters(), b = scaled->named_parameters();
  EXPECT_TRUE(torch::allclose(a["blocks.0.mlp.fc.weight"].grad(),
                              b["blocks.0.mlp.fc.weight"].grad(), 0, 1e-10));
}

}  // namespace layer_drop_test
}  // namespace shardtrain
