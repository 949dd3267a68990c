// The BERT family: its forward against a reference written here with plain ATen ops from the
// module's own parameters (post-norm blocks, exact GELU, no attention mask, the masked-language
// head with its bias), bidirectional attention, the loss over the positions that carry a target,
// its Hugging Face config.json, and quantization-aware training naming its layers as Hugging
// Face does.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/utils.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "model/compression.h"
#include "model/fake_quant.h"
#include "model/layers.h"
#include "shardtrain/config.h"
#include "shardtrain/hf.h"
#include "shardtrain/model.h"
#include "support.h"

namespace shardtrain {
namespace bert_test {

using Params = std::map<std::string, at::Tensor>;

Params params_of(Transformer& model) {
  Params p;
  for (const auto& item : model->named_parameters()) p[item.key()] = item.value().detach();
  return p;
}

// `lookup`: the token embedding the inputs' rows are read from (the tied head keeps the
// parameter); undefined: the parameter.
at::Tensor reference_bert(const ModelConfig& c, Params p, const at::Tensor& tokens,
                          const at::Tensor& lookup = {}) {
  const int64_t t = tokens.size(1);
  auto layer_norm = [&](const at::Tensor& x, const std::string& name) {
    const at::Tensor mean = x.mean(-1, true);
    const at::Tensor var = (x - mean).pow(2).mean(-1, true);
    return (x - mean) / at::sqrt(var + c.norm_eps) * p[name + ".weight"] + p[name + ".bias"];
  };
  auto linear = [&](const at::Tensor& x, const std::string& name) {
    return at::matmul(x, p[name + ".weight"].t()) + p[name + ".bias"];
  };
  auto gelu = [](const at::Tensor& x) { return 0.5 * x * (1 + at::erf(x / std::sqrt(2.0))); };
  auto heads = [&](const at::Tensor& x) {
    return x.reshape({x.size(0), t, c.n_heads, -1}).permute({0, 2, 1, 3});
  };
  at::Tensor x = (lookup.defined() ? lookup : p["tok_emb.weight"]).index({tokens}) +
                 p["pos_emb.weight"].narrow(0, 0, t) + p["type_emb.weight"][0];
  x = layer_norm(x, "emb_norm");
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    const at::Tensor q = heads(linear(x, b + "attn.q"));
    const at::Tensor k = heads(linear(x, b + "attn.k"));
    const at::Tensor v = heads(linear(x, b + "attn.v"));
    // Every query reads every key: no mask.
    const at::Tensor scores =
        at::matmul(q, k.transpose(2, 3)) / std::sqrt(static_cast<double>(q.size(3)));
    const at::Tensor attended =
        at::matmul(at::softmax(scores, -1), v).permute({0, 2, 1, 3}).reshape({x.size(0), t, -1});
    x = layer_norm(x + linear(attended, b + "attn.o"), b + "attn_norm");
    x = layer_norm(x + linear(gelu(linear(x, b + "mlp.fc")), b + "mlp.proj"), b + "mlp_norm");
  }
  const at::Tensor h = layer_norm(gelu(linear(x, "mlm.dense")), "mlm.norm");
  return at::matmul(h, p["tok_emb.weight"].t()) + p["mlm.bias"];
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

// In double precision so the comparison is about the computation, not rounding.
TEST(BertModel, ForwardMatchesTheReferenceThroughEveryKernel) {
  torch::manual_seed(0);
  const ModelConfig c = model_preset("tiny-bert");
  Transformer model(c);
  model->to(at::kDouble);
  model->eval();
  const at::Tensor tokens = at::randint(c.vocab_size, {2, 17}, at::kLong);
  torch::NoGradGuard no_grad;
  const at::Tensor want = reference_bert(c, params_of(model), tokens);
  for (AttentionKernel kernel :
       {AttentionKernel::kBlockwise, AttentionKernel::kFused, AttentionKernel::kReference}) {
    model->set_attention(kernel);
    const at::Tensor logits = model->forward(tokens);
    ASSERT_EQ(logits.sizes(), (at::IntArrayRef{2, 17, c.vocab_size}));
    EXPECT_LT(max_diff(logits, want), 1e-10) << static_cast<int>(kernel);
  }
}

// The gradients too: every kernel's equal those of the reference kernel (attention written out
// and differentiated by autograd), in double precision.
TEST(BertModel, EveryKernelsGradientsEqualTheReferenceKernels) {
  torch::manual_seed(3);
  const ModelConfig c = model_preset("tiny-bert");
  Transformer model(c);
  model->to(at::kDouble);
  const at::Tensor tokens = at::randint(c.vocab_size, {2, 19}, at::kLong);
  const at::Tensor weights = at::randn({2, 19, c.vocab_size}, at::kDouble);
  auto gradients = [&](AttentionKernel kernel) {
    model->set_attention(kernel);
    model->zero_grad();
    (model->forward(tokens) * weights).sum().backward();
    std::map<std::string, at::Tensor> grads;
    for (const auto& item : model->named_parameters())
      grads[item.key()] = item.value().grad().clone();
    return grads;
  };
  const auto want = gradients(AttentionKernel::kReference);
  for (AttentionKernel kernel : {AttentionKernel::kBlockwise, AttentionKernel::kFused}) {
    const auto got = gradients(kernel);
    for (const auto& [name, grad] : want) {
      EXPECT_LT(max_diff(got.at(name), grad), 1e-9)
          << name << " kernel " << static_cast<int>(kernel);
    }
  }
}

TEST(BertModel, EveryPositionReadsTheWholeSequence) {
  torch::manual_seed(1);
  const ModelConfig c = model_preset("tiny-bert");
  Transformer model(c);
  model->eval();
  at::Tensor tokens = at::randint(c.vocab_size, {1, 12}, at::kLong);
  torch::NoGradGuard no_grad;
  const at::Tensor before = model->forward(tokens);
  tokens[0][11] = (tokens[0][11].item<int64_t>() + 1) % c.vocab_size;
  const at::Tensor after = model->forward(tokens);
  // A later token changes the first position's logits (a decoder's would stay).
  EXPECT_GT(max_diff(before[0][0], after[0][0]), 1e-6);
}

// The loss over the targeted positions equals the cross-entropy of forward's logits there, and
// so do the gradients, with and without a divisor.
TEST(BertModel, LossOverTargetedPositionsEqualsTheLogitsCrossEntropy) {
  torch::manual_seed(2);
  const ModelConfig c = model_preset("tiny-bert");
  Transformer model(c);
  const at::Tensor tokens = at::randint(c.vocab_size, {2, 16}, at::kLong);
  at::Tensor targets = at::full({2, 16}, kIgnoreIndex, at::kLong);
  for (int64_t at_position : {1, 5, 6, 13}) targets[0][at_position] = (at_position * 7) % 257;
  targets[1][2] = 42;
  for (const double divisor : {0.0, 3.0}) {
    SCOPED_TRACE(divisor);
    model->zero_grad();
    const at::Tensor loss = model->forward_loss(tokens, SequenceLayout(), {targets, divisor, 0});
    loss.backward();
    std::map<std::string, at::Tensor> grads;
    for (const auto& item : model->named_parameters())
      grads[item.key()] = item.value().grad().clone();
    model->zero_grad();
    const at::Tensor logits = model->forward(tokens);
    const at::Tensor sum =
        at::cross_entropy_loss(logits.reshape({-1, c.vocab_size}), targets.reshape({-1}), {},
                               at::Reduction::Sum, kIgnoreIndex);
    const at::Tensor want = sum / (divisor > 0 ? divisor : 5.0);
    want.backward();
    EXPECT_NEAR(loss.item<double>(), want.item<double>(), 1e-5);
    for (const auto& item : model->named_parameters()) {
      EXPECT_LT(max_diff(grads[item.key()], item.value().grad()), 1e-5) << item.key();
    }
  }
}

// A micro-batch whose positions none was chosen in: with the global batch's divisor its loss
// is 0 and its gradients are zero (other micro-batches carry the step); without one, 0 / 0.
TEST(BertModel, AMicroBatchWithoutTargetsAddsNothing) {
  const ModelConfig c = model_preset("tiny-bert");
  Transformer model(c, ModelInit().seed(7));
  const at::Tensor tokens = at::randint(c.vocab_size, {2, 8}, at::kLong);
  const at::Tensor none = at::full({2, 8}, kIgnoreIndex, at::kLong);
  const at::Tensor loss = model->forward_loss(tokens, SequenceLayout(), {none, 4.0, 0});
  EXPECT_EQ(loss.item<double>(), 0.0);
  loss.backward();
  for (const auto& item : model->named_parameters()) {
    EXPECT_TRUE(!item.value().grad().defined() ||
                item.value().grad().abs().max().item<double>() == 0)
        << item.key();
  }
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(
      std::isnan(model->forward_loss(tokens, SequenceLayout(), {none, 0.0, 0}).item<double>()));
}

TEST(BertModel, HuggingFaceConfigRoundTripsAndRefusesWhatItCannotReproduce) {
  const auto dir = testing::fresh_test_dir("shardtrain_bert_config");
  const ModelConfig base = model_preset("bert-base");
  const std::string path = (dir / "config.json").string();
  std::ofstream(path) << hf_config_json(base);
  const ModelConfig read = model_config_from_hf_json(path);
  EXPECT_EQ(read.family, ModelFamily::kBert);
  EXPECT_EQ(read.num_parameters(), base.num_parameters());
  EXPECT_EQ(read.type_vocab_size, 2);
  EXPECT_DOUBLE_EQ(read.norm_eps, 1e-12);
  EXPECT_DOUBLE_EQ(read.dropout, 0.1);
  auto refusal = [&](const std::string& key, const std::string& value) {
    std::string text = hf_config_json(base);
    const auto at = text.find("\"" + key + "\"");
    if (at == std::string::npos) {
      text.insert(1, "\"" + key + "\": " + value + ",");
    } else {
      const auto end = text.find_first_of(",\n}", text.find(':', at));
      text.replace(at, end - at, "\"" + key + "\": " + value);
    }
    std::ofstream(path) << text;
    return testing::invalid_argument_of([&] { model_config_from_hf_json(path); });
  };
  EXPECT_NE(refusal("hidden_act", "\"relu\"").find("unsupported \"hidden_act\""),
            std::string::npos);
  EXPECT_NE(refusal("position_embedding_type", "\"relative_key\"")
                .find("unsupported \"position_embedding_type\""),
            std::string::npos);
  EXPECT_NE(refusal("attention_probs_dropout_prob", "0.2")
                .find("hidden_dropout_prob and attention_probs_dropout_prob differ"),
            std::string::npos);
  std::filesystem::remove_all(dir);
}

// DeepSpeedExamples' BERT compression files name Hugging Face's modules: "attention.self" (q, k,
// v), "intermediate" (fc) and "output.dense" (o and proj).
TEST(BertModel, CompressionPatternsNameItsLayersAsHuggingFace) {
  const ModelConfig config = model_preset("tiny-bert");
  Transformer model(config, ModelInit().seed(3));
  CompressionSection section;
  section.weight_bits = {8, 4};
  section.weight_modules = {{"attention.self", "intermediate"}, {"output.dense"}};
  const detail::Compression compression(*model, config, section);
  EXPECT_EQ(compression.weight_layers(), 6 * config.n_layers);
  for (const auto& item : model->named_modules("", false)) {
    auto* linear = dynamic_cast<detail::LinearImpl*>(item.value().get());
    if (!linear) continue;
    const std::string& name = item.key();
    const bool first =
        name.find("attn.q") != std::string::npos || name.find("attn.k") != std::string::npos ||
        name.find("attn.v") != std::string::npos || name.find("mlp.fc") != std::string::npos;
    const bool second =
        name.find("attn.o") != std::string::npos || name.find("mlp.proj") != std::string::npos;
    EXPECT_EQ(linear->weight_quant.bits, first ? 8 : second ? 4 : 0) << name;
  }
}

// DeepSpeed's "word_embeddings" group: the inputs are looked up in the quantized token
// embedding, while the tied head projects onto the embedding as it is.
TEST(BertModel, AQuantizedTokenEmbeddingServesTheLookupNotTheHead) {
  const ModelConfig config = model_preset("tiny-bert");
  Transformer model(config, ModelInit().seed(4));
  model->to(at::kDouble);
  model->eval();
  CompressionSection section;
  section.weight_bits = {2};
  section.weight_groups = 48;
  section.weight_modules = {{"word_embeddings"}};
  detail::Compression compression(*model, config, section);
  EXPECT_EQ(compression.weight_layers(), 1);
  compression.set_step(0);
  const at::Tensor tokens = at::randint(config.vocab_size, {2, 9}, at::kLong);
  torch::NoGradGuard no_grad;
  const Params p = params_of(model);
  const at::Tensor quantized =
      detail::fake_quantize(p.at("tok_emb.weight"), detail::Quantizer{2, 48, true});
  EXPECT_FALSE(at::equal(quantized, p.at("tok_emb.weight")));
  EXPECT_LT(max_diff(model->forward(tokens), reference_bert(config, p, tokens, quantized)), 1e-10);
}

}  // namespace bert_test
}  // namespace shardtrain
