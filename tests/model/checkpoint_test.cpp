// Activation checkpointing must be invisible in the numbers: same loss, same gradients and the
// same random-number stream afterwards as the run that keeps its activations, dropout included.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/utils.h>
#include <torch/version.h>

#include <mutex>
#include <string>
#include <vector>

#include "shardtrain/model.h"

namespace shardtrain {
namespace checkpoint_test {

struct Step {
  at::Tensor loss;
  std::vector<at::Tensor> grads;
  at::Tensor rng_after;  // CPU generator state after forward and backward
};

at::Tensor cpu_rng_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_cpu_autocast(bool enabled) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
  at::autocast::set_autocast_enabled(at::kCPU, enabled);
#else
  at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
  at::autocast::set_cpu_enabled(enabled);
#endif
  if (!enabled) at::autocast::clear_cache();
}

// Forward and loss, under bf16 autocast when asked (as the trainer does), then backward outside.
Step train_step(Transformer& model, const at::Tensor& tokens, const at::Tensor& targets,
                bool autocast = false) {
  model->zero_grad();
  torch::manual_seed(1234);  // the dropout masks
  set_cpu_autocast(autocast);
  const at::Tensor logits = model->forward(tokens);
  Step step;
  step.loss = at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
  set_cpu_autocast(false);
  step.loss.backward();
  step.rng_after = cpu_rng_state();
  for (const auto& p : model->parameters()) step.grads.push_back(p.grad().clone());
  return step;
}

class ModelCheckpointing : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelCheckpointing, SameLossGradientsAndRngWithDropout) {
  ModelConfig config = model_preset(GetParam());
  config.dropout = 0.1;
  torch::manual_seed(0);
  Transformer model(config);
  model->train();
  const at::Tensor tokens = at::randint(config.vocab_size, {2, 24}, at::kLong);
  const at::Tensor targets = at::randint(config.vocab_size, {2, 24}, at::kLong);

  const Step plain = train_step(model, tokens, targets);
  // The RNG state a forward alone leaves behind: backward must not move it.
  torch::manual_seed(1234);
  {
    torch::NoGradGuard no_grad;
    model->forward(tokens);
  }
  EXPECT_TRUE(at::equal(plain.rng_after, cpu_rng_state()));

  model->set_activation_checkpointing(true);
  ASSERT_TRUE(model->activation_checkpointing());
  const Step checkpointed = train_step(model, tokens, targets);
  EXPECT_TRUE(at::equal(plain.loss, checkpointed.loss))
      << plain.loss.item<double>() << " vs " << checkpointed.loss.item<double>();
  ASSERT_EQ(plain.grads.size(), checkpointed.grads.size());
  const auto names = model->named_parameters().keys();
  for (size_t i = 0; i < plain.grads.size(); ++i) {
    EXPECT_TRUE(at::equal(plain.grads[i], checkpointed.grads[i])) << names[i];
  }
  EXPECT_TRUE(at::equal(plain.rng_after, checkpointed.rng_after));

  // Dropout was really on: another seed gives another loss.
  model->zero_grad();
  torch::manual_seed(99);
  const at::Tensor other = at::cross_entropy_loss(
      model->forward(tokens).reshape({-1, config.vocab_size}), targets.reshape({-1}));
  EXPECT_FALSE(at::equal(other, plain.loss));
}

TEST_P(ModelCheckpointing, FallbackAttentionAndInferenceToo) {
  ModelConfig config = model_preset(GetParam());
  config.dropout = 0.1;
  torch::manual_seed(0);
  Transformer model(config);
  model->set_attention(AttentionKernel::kReference);
  const at::Tensor tokens = at::randint(config.vocab_size, {1, 16}, at::kLong);
  const at::Tensor targets = at::randint(config.vocab_size, {1, 16}, at::kLong);
  const Step plain = train_step(model, tokens, targets);
  model->set_activation_checkpointing(true);
  const Step checkpointed = train_step(model, tokens, targets);
  EXPECT_TRUE(at::equal(plain.loss, checkpointed.loss));
  for (size_t i = 0; i < plain.grads.size(); ++i) {
    EXPECT_TRUE(at::equal(plain.grads[i], checkpointed.grads[i])) << i;
  }
  // Under NoGradGuard checkpointing has nothing to save and the blocks simply run.
  model->eval();
  torch::NoGradGuard no_grad;
  const at::Tensor logits = model->forward(tokens);
  EXPECT_FALSE(logits.requires_grad());
  model->set_activation_checkpointing(false);
  EXPECT_TRUE(at::equal(logits, model->forward(tokens)));
}

// The backward pass runs outside the autocast scope; the recomputation must still use bf16.
TEST_P(ModelCheckpointing, SameResultsUnderAutocast) {
  ModelConfig config = model_preset(GetParam());
  config.dropout = 0.1;
  torch::manual_seed(0);
  Transformer model(config);
  const at::Tensor tokens = at::randint(config.vocab_size, {2, 16}, at::kLong);
  const at::Tensor targets = at::randint(config.vocab_size, {2, 16}, at::kLong);
  const Step fp32 = train_step(model, tokens, targets);
  const Step plain = train_step(model, tokens, targets, /*autocast=*/true);
  EXPECT_FALSE(at::equal(fp32.loss, plain.loss));  // autocast really changed the numerics
  model->set_activation_checkpointing(true);
  const Step checkpointed = train_step(model, tokens, targets, /*autocast=*/true);
  EXPECT_TRUE(at::equal(plain.loss, checkpointed.loss));
  for (size_t i = 0; i < plain.grads.size(); ++i) {
    EXPECT_TRUE(at::equal(plain.grads[i], checkpointed.grads[i])) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(ModelFamilies, ModelCheckpointing, ::testing::Values("tiny", "tiny-llama"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& ch : name) ch = ch == '-' ? '_' : ch;
                           return name;
                         });

}  // namespace checkpoint_test
}  // namespace shardtrain
