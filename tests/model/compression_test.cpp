// Quantization-aware training ([compression]): the quantizers' grids, the straight-through
// gradient, which layers a group's patterns reach (by our and Hugging Face's names), and that a
// quantizing forward is the forward of the quantized weights.
#include "model/compression.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "model/fake_quant.h"
#include "model/layers.h"
#include "shardtrain/model.h"
#include "support.h"

namespace shardtrain {
namespace compression_test {

using detail::quantized_values;
using detail::Quantizer;

std::string message_of(const std::function<void()>& f) { return testing::invalid_argument_of(f); }

void expect_values(const at::Tensor& got, const std::vector<float>& want) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got.reshape(-1)[static_cast<int64_t>(i)].item<float>(), want[i], 1e-6) << i;
  }
}

TEST(FakeQuantization, GridsOfEachKind) {
  // Symmetric, 3 bits: scale 2 max|x| / 8 = 0.25, codes clamped to [-4, 3].
  expect_values(quantized_values(torch::tensor({-1.0f, -0.5f, 0.3f, 1.0f}), 3, 1, true),
                {-1.0f, -0.5f, 0.25f, 0.75f});
  // Asymmetric, 3 bits: min 0, max 1.6, scale 0.2, codes clamped to [0, 7].
  expect_values(quantized_values(torch::tensor({0.0f, 0.7f, 1.6f}), 3, 1, false),
                {0.0f, 0.8f, 1.4f});
  // Binary: the sign times the mean magnitude.
  expect_values(quantized_values(torch::tensor({1.0f, -3.0f}), 1, 1, true), {2.0f, -2.0f});
  // Ternary: zero below 0.7 x the mean magnitude (1.025), else +-the mean of the kept ones.
  expect_values(quantized_values(torch::tensor({0.1f, 1.0f, -1.0f, 2.0f}), 2, 1, true),
                {0.0f, 4.0f / 3, -4.0f / 3, 4.0f / 3});
  // Groups have their own scales; a group without range stays as it is.
  expect_values(quantized_values(torch::tensor({-1.0f, 0.3f, 10.0f, 3.0f, 0.0f, 0.0f}), 3, 3, true),
                {-1.0f, 0.25f, 7.5f, 2.5f, 0.0f, 0.0f});
  expect_values(quantized_values(torch::tensor({0.5f, 0.5f}), 3, 1, false), {0.5f, 0.5f});
  EXPECT_NE(message_of([] { quantized_values(torch::ones({5}), 8, 2, true); }), "");
}

TEST(FakeQuantization, GradientPassesStraightThrough) {
  const at::Tensor x = torch::randn({4, 6}).requires_grad_();
  const at::Tensor w = torch::randn({4, 6});
  const at::Tensor y = detail::fake_quantize(x, Quantizer{4, 2, true});
  EXPECT_TRUE(at::equal(y.detach(), quantized_values(x, 4, 2, true)));
  (y * w).sum().backward();
  EXPECT_TRUE(at::equal(x.grad(), w));
  // Per token: each row on its own grid.
  const at::Tensor rows = torch::tensor({{1.0f, 0.3f}, {100.0f, 30.0f}});
  expect_values(detail::fake_quantize_tokens(rows, Quantizer{3, 1, true}),
                {0.75f, 0.25f, 75.0f, 25.0f});
}

CompressionSection weights(std::vector<std::vector<std::string>> modules, int64_t bits = 4,
                           int64_t groups = 16) {
  CompressionSection section;
  section.weight_modules = std::move(modules);
  section.weight_bits.assign(section.weight_modules.size(), bits);
  section.weight_groups = groups;
  return section;
}

TEST(Compression, PatternsMatchOurAndHuggingFaceNames) {
  const ModelConfig config = model_preset("tiny");
  Transformer model(config, ModelInit().seed(3));
  // "attn.c_attn" is Hugging Face GPT-2's name of our attn.qkv; "mlp\\.fc$" ours.
  CompressionSection section = weights({{"attn.c_attn"}, {"mlp\\.fc$"}});
  section.activation_bits = {8};
  section.activation_modules = {{"attn.c_proj"}};
  const detail::Compression compression(*model, config, section);
  EXPECT_EQ(compression.weight_layers(), 2 * config.n_layers);
  EXPECT_EQ(compression.activation_layers(), config.n_layers);
  for (const auto& item : model->named_modules("", false)) {
    auto* linear = dynamic_cast<detail::LinearImpl*>(item.value().get());
    if (!linear) continue;
    const bool weight = item.key().find("attn.qkv") != std::string::npos ||
                        item.key().find("mlp.fc") != std::string::npos;
    EXPECT_EQ(linear->weight_quant.bits, weight ? 4 : 0) << item.key();
    EXPECT_EQ(linear->input_quant.bits, item.key().find("attn.proj") != std::string::npos ? 8 : 0)
        << item.key();
  }
}

TEST(Compression, BadGroupsAreRefusedNamingThePattern) {
  const ModelConfig config = model_preset("tiny");
  Transformer model(config, ModelInit().seed(3));
  auto refused = [&](const CompressionSection& section) {
    return message_of([&] { detail::Compression(*model, config, section); });
  };
  EXPECT_NE(refused(weights({{"attn.c_attn", "attention.self"}}))
                .find("compression.weight_modules: 'attention.self' matches no linear layer or "
                      "token embedding; the candidates are 'tok_emb' (transformer.wte), "
                      "'blocks.0.attn.qkv' (transformer.h.0.attn.c_attn)"),
            std::string::npos);
  EXPECT_NE(refused(weights({{"wpe"}}))
                .find("'transformer.wpe' is not quantized: only the linear layers and the token "
                      "embedding are"),
            std::string::npos);
  CompressionSection inputs = weights({{"c_fc"}});
  inputs.activation_bits = {8};
  inputs.activation_modules = {{"wte"}};
  EXPECT_NE(refused(inputs).find("'transformer.wte' is not quantized: only the inputs of linear "
                                 "layers are"),
            std::string::npos);
  EXPECT_NE(refused(weights({{"attn"}, {"c_attn"}}))
                .find("layer 'blocks.0.attn.qkv' (transformer.h.0.attn.c_attn) is matched by "
                      "both 'attn' and 'c_attn'"),
            std::string::npos);
  EXPECT_NE(refused(weights({{"attn(("}})).find("'attn((' is not a regular expression"),
            std::string::npos);
  EXPECT_NE(refused(weights({{"attn.qkv"}}, 8, 7))
                .find("compression.weight_groups = 7 does not divide the"),
            std::string::npos);
}

TEST(Compression, QuantizingForwardIsTheForwardOfQuantizedWeightsFromItsOffset) {
  const ModelConfig config = model_preset("tiny");
  Transformer plain(config, ModelInit().seed(5));
  Transformer quantized(config, ModelInit().seed(5));
  CompressionSection section = weights({{"c_fc"}}, 3, 4);
  section.weight_offset = 2;
  detail::Compression compression(*quantized, config, section);
  const at::Tensor tokens = at::randint(0, 200, {2, 16}, at::kLong);
  compression.set_step(1);  // before the offset: the weights as they are
  EXPECT_TRUE(at::equal(quantized->forward(tokens), plain->forward(tokens)));
  compression.set_step(2);
  {
    torch::NoGradGuard no_grad;
    for (auto& item : plain->named_parameters()) {
      if (item.key().find("mlp.fc.weight") != std::string::npos) {
        item.value().copy_(quantized_values(item.value(), 3, 4, true));
      }
    }
  }
  const at::Tensor got = quantized->forward(tokens);
  EXPECT_TRUE(at::allclose(got, plain->forward(tokens), 1e-5, 1e-6));
  // The gradient reaches the unquantized weights.
  got.sum().backward();
  for (const auto& item : quantized->named_parameters()) {
    EXPECT_TRUE(item.value().grad().defined()) << item.key();
  }
}

}  // namespace compression_test
}  // namespace shardtrain
