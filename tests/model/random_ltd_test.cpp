// Random layer-token dropping: the schedule of the tokens kept (DeepSpeed's fixed_linear), the
// draw (sorted, distinct, the same for the same key, forward and block), and the model under
// set_token_drop: a kept token's output is the block run on the kept tokens alone at their own
// positions, a dropped token's is the model without the block, attention stays causal, and
// evaluation runs every token.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>
#include <vector>

#include "model/layers.h"
#include "shardtrain/model.h"
#include "train/layer_drop.h"

namespace shardtrain {
namespace random_ltd_test {

TEST(RandomLtdSchedule, FollowsDeepSpeedsFixedLinearFromItsMinimum) {
  TrainSection train;
  train.random_ltd_min = 4;
  train.random_ltd_max = 16;
  train.random_ltd_steps = 4;
  train.random_ltd_step = 4;
  // floor(4 + 12 k / 4), down to a multiple of 4, at most 16; the first step runs the minimum.
  const std::vector<int64_t> want = {4, 4, 8, 12, 16, 16, 16};
  for (int64_t completed = 0; completed < static_cast<int64_t>(want.size()); ++completed) {
    EXPECT_EQ(detail::random_ltd_tokens(train, completed), want[static_cast<size_t>(completed)])
        << completed;
  }
  // Past random_ltd_steps the count keeps rising until the maximum caps it: a maximum that is
  // not a multiple of the step is reached (1000 = 128 + 872 k / 10 at k = 10 rounds to 992).
  TrainSection wide;
  wide.random_ltd_min = 128;
  wide.random_ltd_max = 1000;
  wide.random_ltd_steps = 10;
  wide.random_ltd_step = 16;
  EXPECT_EQ(detail::random_ltd_tokens(wide, 10), 992);
  EXPECT_EQ(detail::random_ltd_tokens(wide, 11), 1000);
  EXPECT_EQ(detail::random_ltd_tokens(wide, 500), 1000);
  train.random_ltd_min = 5;  // DeepSpeed starts at min_value itself, rounded only later
  EXPECT_EQ(detail::random_ltd_tokens(train, 0), 5);
  EXPECT_EQ(detail::random_ltd_tokens(train, 1), 4);  // floor(5 + 11 / 4) = 7, down to 4
}

TEST(RandomLtdDraw, SortedDistinctTokensTheSameForTheSameDraw) {
  const at::Tensor kept = detail::draw_kept_tokens(3, 20, 7, 99, 2, 1);
  ASSERT_EQ(kept.sizes(), (std::vector<int64_t>{3, 7}));
  for (int64_t b = 0; b < 3; ++b) {
    std::set<int64_t> seen;
    for (int64_t i = 0; i < 7; ++i) {
      const int64_t t = kept[b][i].item<int64_t>();
      EXPECT_GE(t, 0);
      EXPECT_LT(t, 20);
      if (i > 0) {
        EXPECT_GT(t, kept[b][i - 1].item<int64_t>());
      }
      seen.insert(t);
    }
    EXPECT_EQ(seen.size(), 7u);
  }
  EXPECT_TRUE(kept.equal(detail::draw_kept_tokens(3, 20, 7, 99, 2, 1)));
  EXPECT_FALSE(kept.equal(detail::draw_kept_tokens(3, 20, 7, 99, 3, 1)));   // another forward
  EXPECT_FALSE(kept.equal(detail::draw_kept_tokens(3, 20, 7, 99, 2, 0)));   // another block
  EXPECT_FALSE(kept.equal(detail::draw_kept_tokens(3, 20, 7, 100, 2, 1)));  // another key
  EXPECT_FALSE(kept[0].equal(kept[1]));                                     // each sample its own
  // Every token is drawn about equally often.
  at::Tensor counts = at::zeros({20}, at::kLong);
  for (int64_t forward = 0; forward < 400; ++forward) {
    const at::Tensor k = detail::draw_kept_tokens(1, 20, 5, 7, forward, 0);
    counts.index_add_(0, k.reshape({-1}), at::ones({5}, at::kLong));
  }
  // 100 expected each; Binomial(400, 0.25) has a standard deviation near 8.7.
  EXPECT_GT(counts.min().item<int64_t>(), 60);
  EXPECT_LT(counts.max().item<int64_t>(), 140);
}

// A tiny model in double with no dropout, of the family and block count given.
Transformer tiny_model(const std::string& preset, int64_t layers) {
  torch::manual_seed(5);
  ModelConfig c = model_preset(preset);
  c.n_layers = layers;
  c.dropout = 0.0;
  Transformer model(c);
  model->to(at::kDouble);
  model->train();
  return model;
}

class RandomLtdModel : public ::testing::TestWithParam<std::string> {};

TEST_P(RandomLtdModel, KeptTokensRunTheBlockAtTheirPositionsAndDroppedOnesPassIt) {
  Transformer model = tiny_model(GetParam(), 1);
  const int64_t batch = 2, length = 12, keep = 5;
  const at::Tensor tokens = torch::randint(model->config().vocab_size, {batch, length});
  torch::NoGradGuard no_grad;
  model->set_token_drop({{true}, keep, 42});
  const at::Tensor routed = model->forward(tokens);  // forward 0 of key 42
  const at::Tensor kept = detail::draw_kept_tokens(batch, length, keep, 42, 0, 0);
  model->set_token_drop({});
  // The kept tokens alone through the whole model, each at its own position.
  SequenceLayout layout;
  layout.positions = kept;
  layout.segments = at::zeros_like(kept);
  const at::Tensor alone = model->forward(tokens.gather(1, kept), layout);
  const auto rows = [&](const at::Tensor& logits) {
    return logits.gather(1, kept.unsqueeze(-1).expand({batch, keep, logits.size(2)}));
  };
  EXPECT_TRUE(torch::allclose(rows(routed), alone, 0, 1e-10));
  // The dropped ones: the model without its block.
  model->set_layer_drop({0.0});
  const at::Tensor without = model->forward(tokens);
  model->set_layer_drop({});
  at::Tensor dropped = at::ones({batch, length}, at::kBool);
  dropped.scatter_(1, kept, false);
  const at::Tensor mask = dropped.unsqueeze(-1).expand_as(routed);
  EXPECT_TRUE(torch::allclose(routed.masked_select(mask), without.masked_select(mask), 0, 1e-10));
  EXPECT_FALSE(torch::allclose(routed, model->forward(tokens), 0, 1e-6));
}

TEST_P(RandomLtdModel, AttentionStaysCausalAndEvaluationRunsEveryToken) {
  Transformer model = tiny_model(GetParam(), 2);
  const int64_t length = 10;
  at::Tensor tokens = torch::randint(model->config().vocab_size, {2, length});
  torch::NoGradGuard no_grad;
  model->set_token_drop({{true, true}, 4, 7});
  const at::Tensor first = model->forward(tokens);
  at::Tensor changed = tokens.clone();
  changed.select(1, length - 1)
      .fill_((tokens[0][length - 1].item<int64_t>() + 1) % model->config().vocab_size);
  model->set_token_drop({{true, true}, 4, 7});  // the same draws again
  const at::Tensor second = model->forward(changed);
  EXPECT_TRUE(
      torch::allclose(first.narrow(1, 0, length - 1), second.narrow(1, 0, length - 1), 0, 1e-12));
  // The next forward draws other tokens.
  EXPECT_FALSE(torch::allclose(model->forward(changed), second, 0, 1e-6));
  model->eval();
  const at::Tensor evaluated = model->forward(tokens);
  model->set_token_drop({});
  EXPECT_TRUE(torch::allclose(evaluated, model->forward(tokens), 0, 1e-12));
  model->train();
  EXPECT_THROW(model->set_token_drop({{true}, 4, 7}), std::invalid_argument);
  EXPECT_THROW(model->set_token_drop({{true, false}, 0, 7}), std::invalid_argument);
}

// A sequence no longer than the tokens kept runs whole; gradients reach every block.
TEST_P(RandomLtdModel, ASequenceNoLongerThanTheKeptTokensRunsWhole) {
  Transformer model = tiny_model(GetParam(), 2);
  const at::Tensor tokens = torch::randint(model->config().vocab_size, {2, 6});
  const at::Tensor plain = model->forward(tokens);
  model->set_token_drop({{false, true}, 6, 3});
  EXPECT_TRUE(torch::allclose(model->forward(tokens), plain, 0, 1e-12));
  model->set_token_drop({{false, true}, 3, 3});
  model->forward(tokens).sum().backward();
  for (const auto& item : model->named_parameters()) {
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    EXPECT_GT(item.value().grad().abs().sum().item<double>(), 0.0) << item.key();
  }
}

INSTANTIATE_TEST_SUITE_P(Families, RandomLtdModel, ::testing::Values("tiny", "tiny-llama"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) c = c == '-' ? '_' : c;
                           return name;
                         });

}  // namespace random_ltd_test
}  // namespace shardtrain
