// The mixture-of-experts block against a straightforward per-token reference (each token's
// softmax, its top k experts, their outputs weighted and summed), forward and gradients, with
// and without shared experts and with a capacity: in double, within 1e-10, and in fp32 within
// 1e-5. The load-balancing loss enters the gradient with its coefficient and the step's factor
// and nowhere else; an expert no token chooses gets a zero gradient; the routing counts are not
// counted twice when activation checkpointing recomputes a block; the configuration refuses what
// it cannot build, with one message each.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "model/layers.h"
#include "shardtrain/model.h"
#include "shardtrain/train.h"

namespace shardtrain::detail {
namespace moe_test {

ModelConfig moe_config(int64_t shared, double capacity = 0.0, bool normalize = true) {
  ModelConfig c = model_preset("tiny-moe");
  c.d_model = 16;
  c.ffn_hidden = 24;
  c.n_experts = 4;
  c.experts_per_token = 2;
  c.n_shared_experts = shared;
  if (shared > 0) c.hf_model_type.clear();
  c.capacity_factor = capacity;
  c.norm_topk_prob = normalize;
  c.router_aux_loss_coef = 0.1;
  c.validate();
  return c;
}

// A block with every weight drawn at random, in `dtype`.
Moe random_block(const ModelConfig& c, at::ScalarType dtype) {
  Moe block(c, 0, false);
  torch::NoGradGuard no_grad;
  for (auto& p : block->parameters()) p.copy_(at::randn_like(p) * 0.3);
  block->to(dtype);
  return block;
}

at::Tensor swiglu(torch::nn::Module& mlp, const at::Tensor& x) {
  auto params = mlp.named_parameters();
  return at::linear(
      at::silu(at::linear(x, params["gate.weight"])) * at::linear(x, params["up.weight"]),
      params["down.weight"]);
}

// Token by token: softmax over the router's logits, the top k (renormalized when asked), each
// chosen expert's output times its weight; an expert past its capacity (its first `capacity`
// assignments in token order) skipped.
at::Tensor reference(Moe& block, const ModelConfig& c, const at::Tensor& x) {
  const at::Tensor flat = x.reshape({-1, c.d_model});
  const int64_t tokens = flat.size(0);
  const int64_t capacity =
      c.capacity_factor > 0.0
          ? static_cast<int64_t>(std::ceil(c.capacity_factor * tokens * c.experts_per_token /
                                           static_cast<double>(c.n_experts)))
          : tokens * c.experts_per_token;
  std::map<int64_t, int64_t> taken;
  std::vector<at::Tensor> rows;
  for (int64_t t = 0; t < tokens; ++t) {
    const at::Tensor xt = flat[t];
    const at::Tensor probs = at::softmax(at::mv(block->router->weight, xt), 0);
    const auto [top, chosen] = probs.topk(c.experts_per_token);
    at::Tensor y = at::zeros_like(xt);
    for (int64_t j = 0; j < c.experts_per_token; ++j) {
      const int64_t e = chosen[j].item<int64_t>();
      const at::Tensor weight = c.norm_topk_prob ? top[j] / top.sum() : top[j];
      if (taken[e]++ >= capacity) continue;
      y = y + weight * swiglu(*block->expert(e), xt.unsqueeze(0)).squeeze(0);
    }
    if (block->shared) y = y + swiglu(*block->shared, xt.unsqueeze(0)).squeeze(0);
    rows.push_back(y);
  }
  return at::stack(rows).view(x.sizes());
}

// The load-balancing loss row by row: n_experts x sum_e (share of the row's assignments to e) x
// (mean probability of e over the row), averaged over the rows.
at::Tensor reference_aux(Moe& block, const ModelConfig& c, const at::Tensor& x) {
  at::Tensor total = at::zeros({}, x.options());
  for (int64_t b = 0; b < x.size(0); ++b) {
    const at::Tensor probs = at::softmax(at::linear(x[b], block->router->weight), -1);  // [T, E]
    const at::Tensor chosen = std::get<1>(probs.topk(c.experts_per_token, -1));
    for (int64_t e = 0; e < c.n_experts; ++e) {
      const double share = (chosen == e).sum().item<double>() / static_cast<double>(x.size(1));
      total = total + share * probs.select(1, e).mean();
    }
  }
  return total * static_cast<double>(c.n_experts) / static_cast<double>(x.size(0));
}

std::map<std::string, at::Tensor> gradients(Moe& block, const at::Tensor& x) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : block->named_parameters()) out[item.key()] = item.value().grad().clone();
  out["input"] = x.grad().clone();
  return out;
}

void zero_gradients(Moe& block, at::Tensor& x) {
  for (auto& p : block->parameters()) p.mutable_grad() = at::Tensor();
  x.mutable_grad() = at::Tensor();
}

double relative(const at::Tensor& got, const at::Tensor& want) {
  return (got - want).abs().max().item<double>() / (want.abs().max().item<double>() + 1e-30);
}

void expect_equals_reference(const ModelConfig& c, at::ScalarType dtype, double tolerance) {
  torch::manual_seed(1);
  Moe block = random_block(c, dtype);
  block->eval();  // no load-balancing loss: the block alone
  at::Tensor x = at::randn({3, 7, c.d_model}, at::TensorOptions(dtype)).requires_grad_();
  const at::Tensor dout = at::randn({3, 7, c.d_model}, at::TensorOptions(dtype));

  const at::Tensor got = block->forward(x, nullptr);
  (got * dout).sum().backward();
  const auto got_grads = gradients(block, x);
  zero_gradients(block, x);
  const at::Tensor want = reference(block, c, x);
  (want * dout).sum().backward();
  const auto want_grads = gradients(block, x);

  EXPECT_LT(relative(got, want), tolerance);
  for (const auto& [name, grad] : want_grads) {
    EXPECT_LT(relative(got_grads.at(name), grad), tolerance) << name;
  }
}

TEST(MoeBlock, EqualsThePerTokenReference) {
  for (const int64_t shared : {0, 1}) {
    for (const bool normalize : {true, false}) {
      SCOPED_TRACE("shared " + std::to_string(shared) + ", normalized " +
                   std::to_string(normalize));
      expect_equals_reference(moe_config(shared, 0.0, normalize), at::kDouble, 1e-10);
      expect_equals_reference(moe_config(shared, 0.0, normalize), at::kFloat, 1e-5);
    }
  }
}

TEST(MoeBlock, ACapacitySkipsTheAssignmentsPastIt) {
  // 21 tokens x 2 / 4 experts x 0.5: each expert takes its first 6 assignments of 42.
  expect_equals_reference(moe_config(0, 0.5), at::kDouble, 1e-10);
  expect_equals_reference(moe_config(1, 0.5), at::kFloat, 1e-5);
}

TEST(MoeBlock, TheLoadBalancingLossJoinsTheGradientWithItsWeight) {
  const ModelConfig c = moe_config(0);
  torch::manual_seed(2);
  Moe block = random_block(c, at::kDouble);
  block->train();
  MoeState state;
  state.aux_weight = 0.25;  // e.g. a step of four micro-batches
  state.tokens = at::zeros({1, c.n_experts}, at::kLong);
  at::Tensor x = at::randn({3, 7, c.d_model}, at::kDouble).requires_grad_();
  const at::Tensor dout = at::randn({3, 7, c.d_model}, at::kDouble);

  const at::Tensor got = block->forward(x, &state);
  (got * dout).sum().backward();
  const auto got_grads = gradients(block, x);
  zero_gradients(block, x);
  const at::Tensor aux = reference_aux(block, c, x);
  ((reference(block, c, x) * dout).sum() + c.router_aux_loss_coef * 0.25 * aux).backward();
  const auto want_grads = gradients(block, x);
  for (const auto& [name, grad] : want_grads) {
    EXPECT_LT(relative(got_grads.at(name), grad), 1e-10) << name;
  }
  // The router's gradient is not the block's alone: the loss reached it.
  zero_gradients(block, x);
  (reference(block, c, x) * dout).sum().backward();
  EXPECT_GT(relative(got_grads.at("router.weight"), block->router->weight.grad()), 1e-6);

  EXPECT_NEAR(state.aux_sum, aux.item<double>(), 1e-12);
  EXPECT_EQ(state.aux_count, 1);
  EXPECT_EQ(state.tokens.sum().item<int64_t>(), 3 * 7 * c.experts_per_token);
}

TEST(MoeBlock, AnExpertNoTokenChoosesGetsAZeroGradient) {
  ModelConfig c = moe_config(0);
  c.experts_per_token = 1;
  torch::manual_seed(3);
  Moe block = random_block(c, at::kFloat);
  {
    // Every token prefers expert 0: positive inputs, a positive row for it, zeros for the rest.
    torch::NoGradGuard no_grad;
    block->router->weight.zero_();
    block->router->weight[0].fill_(1.0);
  }
  block->train();
  MoeState state;
  state.tokens = at::zeros({1, c.n_experts}, at::kLong);
  at::Tensor x = (at::rand({2, 5, c.d_model}) + 0.1).requires_grad_();
  block->forward(x, &state).sum().backward();
  EXPECT_EQ(state.tokens[0][0].item<int64_t>(), 10);
  for (int64_t e = 1; e < c.n_experts; ++e) {
    for (const auto& p : block->expert(e)->parameters()) {
      ASSERT_TRUE(p.grad().defined()) << "expert " << e;
      EXPECT_EQ(p.grad().abs().max().item<float>(), 0.0f) << "expert " << e;
    }
  }
  EXPECT_GT(block->expert(0)->parameters()[0].grad().abs().max().item<float>(), 0.0f);
}

TEST(MoeBlock, RecomputedBlocksAreCountedOnce) {
  for (const bool checkpointing : {false, true}) {
    torch::manual_seed(4);
    Transformer model(model_preset("tiny-moe"), ModelInit().seed(5));
    model->set_activation_checkpointing(checkpointing);
    model->train();
    const at::Tensor tokens = at::randint(0, 257, {2, 9}, at::kLong);
    model->forward(tokens).sum().backward();
    const MoeStats stats = model->take_moe_stats();
    EXPECT_EQ(stats.aux_losses, 2) << checkpointing;  // one per layer
    EXPECT_EQ(stats.tokens_per_expert.sum(1).eq(2 * 9 * 2).all().item<bool>(), true);
    EXPECT_EQ(model->take_moe_stats().aux_losses, 0);  // taken: counting starts again
  }
}

TEST(MoeConfig, RefusesWhatItCannotBuild) {
  auto refused = [](const std::function<void(ModelConfig&)>& change, const std::string& words) {
    ModelConfig c = model_preset("tiny-moe");
    change(c);
    try {
      c.validate();
      ADD_FAILURE() << "accepted; expected: " << words;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused([](ModelConfig& c) { c.experts_per_token = 5; },
          "experts_per_token 5 exceeds n_experts 4");
  refused([](ModelConfig& c) { c.experts_per_token = 0; }, "experts_per_token must be at least 1");
  refused([](ModelConfig& c) { c.n_shared_experts = 1; }, "mixtral has no shared experts");
  refused([](ModelConfig& c) { c.capacity_factor = -1; }, "capacity_factor");
  refused(
      [](ModelConfig& c) {
        c.n_experts = 0;
        c.hf_model_type.clear();
      },
      "belong to a mixture-of-experts model");
  refused([](ModelConfig& c) { c.hf_model_type = "qwen3"; }, "has no experts");
  ModelConfig gpt2 = model_preset("tiny");
  gpt2.n_experts = 4;
  gpt2.experts_per_token = 2;
  EXPECT_THROW(gpt2.validate(), std::invalid_argument);
}

TEST(MoeConfig, TotalAndActiveParameters) {
  const ModelConfig c = model_preset("mixtral-8x7b");
  // Mixtral's model card: 46.7B parameters, 12.9B active per token.
  EXPECT_NEAR(static_cast<double>(c.num_parameters()) / 1e9, 46.70, 0.01);
  EXPECT_NEAR(static_cast<double>(c.active_parameters()) / 1e9, 12.88, 0.01);
  const ModelConfig q = model_preset("qwen3-30b-a3b");
  EXPECT_NEAR(static_cast<double>(q.num_parameters()) / 1e9, 30.5, 0.1);
  EXPECT_NEAR(static_cast<double>(q.active_parameters()) / 1e9, 3.3, 0.1);
  const ModelConfig dense = model_preset("tiny-llama");
  EXPECT_EQ(dense.active_parameters(), dense.num_parameters());
}

}  // namespace moe_test
}  // namespace shardtrain::detail
