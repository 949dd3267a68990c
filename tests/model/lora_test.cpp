// LoRA adapters: placement, initialization, freezing, forward and merge, on the reference model
// and on a user's torch::nn::Linear layers.
#include "shardtrain/lora.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardtrain/model.h"
#include "support.h"

namespace shardtrain {
namespace lora_test {

constexpr uint64_t kSeed = 11;

at::Tensor tokens() { return at::randint(0, 200, {2, 16}, at::kLong); }

at::Tensor param(torch::nn::Module& module, const std::string& name) {
  return module.named_parameters()[name];
}

std::string message_of(const std::function<void()>& f) { return testing::invalid_argument_of(f); }

TEST(Lora, FirstForwardEqualsTheBaseModelAndOnlyAdaptersTrain) {
  Transformer model(model_preset("tiny"), ModelInit().seed(kSeed));
  const at::Tensor input = tokens();
  const at::Tensor base = model->forward(input).detach();
  const auto layers = add_lora(*model, LoraOptions().rank(4).alpha(8));
  EXPECT_EQ(layers, lora_candidate_layers(*model));  // all-linear: every linear layer here
  ASSERT_FALSE(layers.empty());
  EXPECT_TRUE(at::equal(model->forward(input), base));
  int64_t trainable = 0;
  for (const auto& item : model->named_parameters()) {
    const bool adapter = item.key().find(".lora_") != std::string::npos;
    EXPECT_EQ(item.value().requires_grad(), adapter) << item.key();
    if (adapter) trainable += item.value().numel();
  }
  // qkv: A [4, d], B [3d, 4]; ... every matrix gets r (in + out) elements.
  const at::Tensor a = param(*model, layers[0] + ".lora_A.weight");
  const at::Tensor b = param(*model, layers[0] + ".lora_B.weight");
  EXPECT_EQ(a.size(0), 4);
  EXPECT_EQ(b.size(1), 4);
  EXPECT_TRUE(at::equal(b, at::zeros_like(b)));
  const double bound = 1.0 / std::sqrt(static_cast<double>(a.size(1)));
  EXPECT_LE(a.abs().max().item<double>(), bound);
  EXPECT_GT(a.std().item<double>(), bound / 4);  // drawn, not zero
  EXPECT_GT(trainable, 0);
}

TEST(Lora, GradientsReachOnlyTheAdapters) {
  Transformer model(model_preset("tiny"), ModelInit().seed(kSeed));
  add_lora(*model, LoraOptions().rank(2).target_modules({"attn.qkv"}));
  {
    // A non-zero B so that every adapter weight gets a gradient.
    torch::NoGradGuard no_grad;
    for (auto& item : model->named_parameters()) {
      if (item.key().find("lora_B") != std::string::npos) item.value().fill_(0.01);
    }
  }
  model->forward(tokens()).sum().backward();
  for (const auto& item : model->named_parameters()) {
    EXPECT_EQ(item.value().grad().defined(), item.value().requires_grad()) << item.key();
  }
}

TEST(Lora, DeferredAdaptersInitializeAsEagerOnes) {
  Transformer eager(model_preset("tiny"), ModelInit().seed(kSeed));
  add_lora(*eager, LoraOptions().rank(3));
  Transformer deferred(model_preset("tiny"), ModelInit().seed(kSeed).deferred());
  add_lora(*deferred, LoraOptions().rank(3));
  EXPECT_FALSE(deferred->materialized());
  deferred->materialize();
  const auto want = eager->named_parameters();
  for (const auto& item : deferred->named_parameters()) {
    EXPECT_TRUE(at::equal(item.value(), want[item.key()])) << item.key();
  }
}

TEST(Lora, MergedWeightsComputeWhatTheAdaptersDo) {
  Transformer model(model_preset("tiny-llama"), ModelInit().seed(kSeed));
  const auto layers =
      add_lora(*model, LoraOptions().rank(4).alpha(32).target_modules({"attn.q", "attn.v"}));
  ASSERT_EQ(layers.size(), 2u * static_cast<size_t>(model->config().n_layers));
  {
    torch::NoGradGuard no_grad;
    for (auto& item : model->named_parameters()) {
      if (item.key().find("lora_B") != std::string::npos) item.value().normal_(0, 0.05);
    }
  }
  const at::Tensor input = tokens();
  const at::Tensor adapted = model->forward(input).detach();
  Transformer merged(model_preset("tiny-llama"), ModelInit().seed(kSeed));
  {
    torch::NoGradGuard no_grad;
    for (const auto& layer : layers) {
      param(*merged, layer + ".weight")
          .copy_(merge_lora_weight(param(*model, layer + ".weight"),
                                   param(*model, layer + ".lora_A.weight"),
                                   param(*model, layer + ".lora_B.weight"), 32.0 / 4));
    }
  }
  const at::Tensor got = merged->forward(input);
  EXPECT_LE((got - adapted).abs().max().item<double>(), 1e-5);
  // The adapters changed the output: the merge is not trivially the base.
  Transformer base(model_preset("tiny-llama"), ModelInit().seed(kSeed));
  EXPECT_GT((base->forward(input) - adapted).abs().max().item<double>(), 1e-4);
}

// A user's module: its parent calls the linear layers through shardtrain::call.
struct TwoLayerImpl : torch::nn::Module {
  TwoLayerImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 4));
  }
  at::Tensor forward(const at::Tensor& x) { return call(fc2, at::relu(call(fc1, x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(TwoLayer);

TEST(Lora, UserLinearLayersGetAdaptersThroughCall) {
  torch::manual_seed(3);
  TwoLayer net;
  const at::Tensor x = at::randn({5, 8});
  const at::Tensor before = net->forward(x).detach();
  const auto layers = add_lora(*net, LoraOptions().rank(2).alpha(4).target_modules({"fc1"}));
  ASSERT_EQ(layers, std::vector<std::string>{"fc1"});
  EXPECT_TRUE(at::equal(net->forward(x), before));  // B = 0
  at::Tensor a = param(*net, "fc1.lora_A.weight"), b = param(*net, "fc1.lora_B.weight");
  {
    torch::NoGradGuard no_grad;
    b.normal_();
  }
  const at::Tensor hidden = at::relu(at::linear(x, net->fc1->weight, net->fc1->bias) +
                                     at::linear(at::linear(x, a), b) * 2.0);
  const at::Tensor want = at::linear(hidden, net->fc2->weight, net->fc2->bias);
  const at::Tensor got = net->forward(x);
  EXPECT_LE((got - want).abs().max().item<double>(), 1e-5);
  got.sum().backward();
  EXPECT_TRUE(a.grad().defined() && b.grad().defined());
  EXPECT_FALSE(net->fc1->weight.grad().defined());
  EXPECT_FALSE(net->fc2->weight.requires_grad());
}

TEST(Lora, BadOptionsAreNamed) {
  Transformer model(model_preset("tiny"), ModelInit().seed(kSeed));
  const std::string none =
      message_of([&] { add_lora(*model, LoraOptions().target_modules({"attn.nothing"})); });
  EXPECT_NE(none.find("attn.nothing"), std::string::npos) << none;
  EXPECT_NE(none.find("blocks.0.attn.qkv"), std::string::npos) << none;  // what there is
  EXPECT_NE(message_of([&] { add_lora(*model, LoraOptions().rank(0)); }).find("rank"),
            std::string::npos);
  EXPECT_NE(message_of([&] { add_lora(*model, LoraOptions().dropout(1.5)); }).find("dropout"),
            std::string::npos);
  // Every entry must match: a misspelt one beside one that matches is named, nothing adapted.
  const std::string one = message_of([&] {
    add_lora(*model, LoraOptions().target_modules({"attn.qkv", "mlp.fcc"}));
  });
  EXPECT_NE(one.find("target_modules [mlp.fcc] match no linear layer (the other entries match " +
                     std::to_string(model->config().n_layers) + ")"),
            std::string::npos)
      << one;
  EXPECT_FALSE(model->named_parameters().contains("blocks.0.attn.qkv.lora_A.weight"));
  add_lora(*model, LoraOptions().target_modules({"mlp.fc"}));
  EXPECT_NE(message_of([&] {
              add_lora(*model, LoraOptions().target_modules({"mlp.fc"}));
            }).find("already has an adapter"),
            std::string::npos);
}

}  // namespace lora_test
}  // namespace shardtrain
