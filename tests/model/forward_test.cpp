// Forward pass of both families against references written here with plain ATen ops from the
// module's own parameters, plus the properties each piece must have (causality, RoPE, GQA).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/utils.h>

#include <cmath>
#include <map>
#include <stdexcept>
#include <string>

#include "model/layers.h"
#include "shardtrain/model.h"

namespace shardtrain {
namespace forward_test {

constexpr AttentionKernel kAttentionKernels[] = {
    AttentionKernel::kBlockwise, AttentionKernel::kFused, AttentionKernel::kReference};

using Params = std::map<std::string, at::Tensor>;

Params params_of(Transformer& model) {
  Params p;
  for (const auto& item : model->named_parameters()) p[item.key()] = item.value().detach();
  return p;
}

at::Tensor dense(const at::Tensor& x, const at::Tensor& w) { return at::matmul(x, w.t()); }

// softmax(q k^T / sqrt(d) with -inf above the diagonal) v, for [B, H, T, hd].
at::Tensor reference_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t t = q.size(2);
  at::Tensor scores = at::matmul(q, k.transpose(2, 3)) / std::sqrt(static_cast<double>(q.size(3)));
  at::Tensor mask = at::zeros({t, t}, scores.options());
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = i + 1; j < t; ++j) mask[i][j] = -INFINITY;
  }
  return at::matmul(at::softmax(scores + mask, -1), v);
}

at::Tensor heads(const at::Tensor& x, int64_t n) {  // [B, T, n*hd] -> [B, n, T, hd]
  return x.reshape({x.size(0), x.size(1), n, -1}).permute({0, 2, 1, 3});
}
at::Tensor unheads(const at::Tensor& x) {  // [B, n, T, hd] -> [B, T, n*hd]
  return x.permute({0, 2, 1, 3}).reshape({x.size(0), x.size(2), -1});
}

at::Tensor reference_gpt2(const ModelConfig& c, Params p, const at::Tensor& tokens) {
  const int64_t t = tokens.size(1);
  auto layer_norm = [&](const at::Tensor& x, const std::string& name) {
    const at::Tensor mean = x.mean(-1, true);
    const at::Tensor var = (x - mean).pow(2).mean(-1, true);
    return (x - mean) / at::sqrt(var + c.norm_eps) * p[name + ".weight"] + p[name + ".bias"];
  };
  auto gelu_tanh = [](const at::Tensor& x) {
    return 0.5 * x * (1 + at::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x.pow(3))));
  };
  at::Tensor x = p["tok_emb.weight"].index({tokens}) + p["pos_emb.weight"].narrow(0, 0, t);
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    const at::Tensor qkv =
        dense(layer_norm(x, b + "ln1"), p[b + "attn.qkv.weight"]) + p[b + "attn.qkv.bias"];
    const int64_t d = c.d_model;
    const at::Tensor att = reference_attention(heads(qkv.narrow(-1, 0, d), c.n_heads),
                                               heads(qkv.narrow(-1, d, d), c.n_heads),
                                               heads(qkv.narrow(-1, 2 * d, d), c.n_heads));
    x = x + dense(unheads(att), p[b + "attn.proj.weight"]) + p[b + "attn.proj.bias"];
    const at::Tensor hidden =
        gelu_tanh(dense(layer_norm(x, b + "ln2"), p[b + "mlp.fc.weight"]) + p[b + "mlp.fc.bias"]);
    x = x + dense(hidden, p[b + "mlp.proj.weight"]) + p[b + "mlp.proj.bias"];
  }
  return dense(layer_norm(x, "ln_f"), p["tok_emb.weight"]);
}

// Meta's apply_scaling() of Llama 3.1 (llama-models, reference implementation), one frequency at
// a time: wavelengths below context / high_freq_factor kept, above context / low_freq_factor
// divided by the factor, and blended between.
double llama31_scaled(double freq, const RopeScaling& r) {
  if (!r.enabled()) return freq;
  const double context = static_cast<double>(r.original_context_length);
  const double low_freq_wavelen = context / r.low_freq_factor;
  const double high_freq_wavelen = context / r.high_freq_factor;
  const double wavelen = 2 * M_PI / freq;
  if (wavelen < high_freq_wavelen) return freq;
  if (wavelen > low_freq_wavelen) return freq / r.factor;
  const double smooth =
      (context / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  return (1 - smooth) * freq / r.factor + smooth * freq;
}

// Rotation of each (j, j + hd/2) pair of x [B, H, T, hd] by position * theta^(-2j/hd), with
// Llama 3.1's scaling of the frequencies when the config has it.
at::Tensor reference_rope(const at::Tensor& x, double theta, const RopeScaling& scaling = {}) {
  const int64_t t = x.size(2), half = x.size(3) / 2;
  at::Tensor angle = at::empty({t, half}, x.options());
  for (int64_t pos = 0; pos < t; ++pos) {
    for (int64_t j = 0; j < half; ++j) {
      angle[pos][j] = pos * llama31_scaled(std::pow(theta, -2.0 * j / (2.0 * half)), scaling);
    }
  }
  const at::Tensor x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
  return at::cat({x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin()}, -1);
}

// Llama and its variants: Qwen2's q/k/v biases, Qwen3's per-head norms and head size, Llama
// 3.1's RoPE scaling.
at::Tensor reference_llama(const ModelConfig& c, Params p, const at::Tensor& tokens) {
  auto rms_norm = [&](const at::Tensor& x, const std::string& name) {
    return x / at::sqrt(x.pow(2).mean(-1, true) + c.norm_eps) * p[name + ".weight"];
  };
  const int64_t group = c.n_heads / c.n_kv_heads;
  at::Tensor x = p["tok_emb.weight"].index({tokens});
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    const at::Tensor h = rms_norm(x, b + "attn_norm");
    auto project = [&](const std::string& name, int64_t n) {
      at::Tensor y = dense(h, p[b + "attn." + name + ".weight"]);
      if (c.attention_bias) y = y + p[b + "attn." + name + ".bias"];
      y = heads(y, n);
      return c.qk_norm && name != "v" ? rms_norm(y, b + "attn." + name + "_norm") : y;
    };
    const at::Tensor q = reference_rope(project("q", c.n_heads), c.rope_theta, c.rope_scaling);
    const at::Tensor k = reference_rope(project("k", c.n_kv_heads), c.rope_theta, c.rope_scaling);
    const at::Tensor v = project("v", c.n_kv_heads);
    const at::Tensor att =
        reference_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1));
    x = x + dense(unheads(att), p[b + "attn.o.weight"]);
    const at::Tensor g = rms_norm(x, b + "ffn_norm");
    const at::Tensor gate = dense(g, p[b + "mlp.gate.weight"]);
    x = x + dense(gate * at::sigmoid(gate) * dense(g, p[b + "mlp.up.weight"]),
                  p[b + "mlp.down.weight"]);
  }
  return dense(rms_norm(x, "norm"), p[c.tie_embeddings ? "tok_emb.weight" : "lm_head.weight"]);
}

at::Tensor random_tokens(const ModelConfig& c, int64_t batch, int64_t length) {
  return at::randint(c.vocab_size, {batch, length}, at::kLong);
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

// In double precision so the comparison is about the computation, not rounding.
TEST(ModelForward, Gpt2MatchesReference) {
  torch::manual_seed(0);
  const ModelConfig c = model_preset("tiny");
  Transformer model(c);
  model->to(at::kDouble);
  model->eval();
  const at::Tensor tokens = random_tokens(c, 2, 17);
  torch::NoGradGuard no_grad;
  for (AttentionKernel kernel : kAttentionKernels) {
    model->set_attention(kernel);
    const at::Tensor logits = model->forward(tokens);
    ASSERT_EQ(logits.sizes(), (at::IntArrayRef{2, 17, c.vocab_size}));
    EXPECT_EQ(logits.scalar_type(), at::kDouble);
    EXPECT_LT(max_diff(logits, reference_gpt2(c, params_of(model), tokens)), 1e-10)
        << static_cast<int>(kernel);
  }
}

TEST(ModelForward, LlamaMatchesReference) {
  torch::manual_seed(0);
  ModelConfig c = model_preset("tiny-llama");
  for (bool tied : {false, true}) {
    c.tie_embeddings = tied;
    Transformer model(c);
    model->to(at::kDouble);
    const at::Tensor tokens = random_tokens(c, 2, 23);
    torch::NoGradGuard no_grad;
    const at::Tensor logits = model->forward(tokens);
    ASSERT_EQ(logits.sizes(), (at::IntArrayRef{2, 23, c.vocab_size}));
    EXPECT_LT(max_diff(logits, reference_llama(c, params_of(model), tokens)), 1e-10) << tied;
  }
}

// Each variant of the Llama decoder against the reference: the biases and norm weights are
// drawn at random, since their initialization (zero, one) would hide a bias or norm not applied.
TEST(ModelForward, LlamaVariantsMatchReference) {
  for (const char* preset : {"tiny-llama3.2", "tiny-qwen2", "tiny-qwen3", "tiny-mistral"}) {
    torch::manual_seed(0);
    const ModelConfig c = model_preset(preset);
    Transformer model(c);
    model->to(at::kDouble);
    torch::NoGradGuard no_grad;
    for (auto& param : model->parameters()) {
      if (param.dim() == 1) param.add_(at::randn_like(param) * 0.5);
    }
    const at::Tensor tokens = random_tokens(c, 2, 31);
    for (AttentionKernel kernel : kAttentionKernels) {
      model->set_attention(kernel);
      const at::Tensor logits = model->forward(tokens);
      ASSERT_EQ(logits.sizes(), (at::IntArrayRef{2, 31, c.vocab_size})) << preset;
      EXPECT_LT(max_diff(logits, reference_llama(c, params_of(model), tokens)), 1e-10)
          << preset << " kernel " << static_cast<int>(kernel);
    }
  }
}

// Llama 3.1's scaled frequencies against Meta's formula, for the published settings (3.1 and
// 3.3: factor 8; 3.2: 32) and the test preset whose short original context reaches all three
// bands; and the bands are where the formula puts them.
TEST(ModelForward, Llama31ScaledRopeFrequenciesEqualThePublishedFormula) {
  for (const char* preset : {"llama3.1-8b", "llama3.2-1b", "llama3.2-3b", "tiny-llama3.2"}) {
    const ModelConfig c = model_preset(preset);
    ASSERT_TRUE(c.rope_scaling.enabled()) << preset;
    const at::Tensor freqs =
        detail::rope_inverse_frequencies(c.head_size(), c.rope_theta, c.rope_scaling);
    const int64_t half = c.head_size() / 2;
    ASSERT_EQ(freqs.numel(), half);
    int kept = 0, divided = 0, blended = 0;
    for (int64_t j = 0; j < half; ++j) {
      const double plain = std::pow(c.rope_theta, -2.0 * j / static_cast<double>(c.head_size()));
      const double expected = llama31_scaled(plain, c.rope_scaling);
      EXPECT_NEAR(freqs[j].item<double>(), expected, 1e-14 * std::abs(expected))
          << preset << " j " << j;
      kept += expected == plain;
      divided += expected == plain / c.rope_scaling.factor;
      blended += expected != plain && expected != plain / c.rope_scaling.factor;
    }
    EXPECT_GT(kept, 0) << preset;
    EXPECT_GT(divided, 0) << preset;
    EXPECT_GT(blended, 0) << preset;
  }
  // Without scaling the frequencies are the plain ones.
  const ModelConfig plain = model_preset("llama3-8b");
  const at::Tensor freqs =
      detail::rope_inverse_frequencies(plain.head_size(), plain.rope_theta, plain.rope_scaling);
  EXPECT_DOUBLE_EQ(freqs[1].item<double>(), std::pow(500000.0, -2.0 / 128.0));
}

TEST(ModelForward, LaterTokensDoNotChangeEarlierLogits) {
  for (const char* preset : {"tiny", "tiny-llama"}) {
    torch::manual_seed(1);
    const ModelConfig c = model_preset(preset);
    Transformer model(c);
    torch::NoGradGuard no_grad;
    const at::Tensor a = random_tokens(c, 1, 32);
    at::Tensor b = a.clone();
    b[0][20] = (a[0][20].item<int64_t>() + 1) % c.vocab_size;
    for (AttentionKernel kernel : kAttentionKernels) {
      model->set_attention(kernel);
      const at::Tensor la = model->forward(a), lb = model->forward(b);
      EXPECT_LT(max_diff(la.narrow(1, 0, 20), lb.narrow(1, 0, 20)), 1e-6) << preset;
      EXPECT_GT(max_diff(la.narrow(1, 20, 12), lb.narrow(1, 20, 12)), 1e-4) << preset;
    }
  }
}

// A head/batch mix-up in the reshapes would leak information between sequences of a batch.
TEST(ModelForward, BatchRowsAreIndependent) {
  for (const char* preset : {"tiny", "tiny-llama"}) {
    torch::manual_seed(4);
    const ModelConfig c = model_preset(preset);
    Transformer model(c);
    torch::NoGradGuard no_grad;
    const at::Tensor tokens = random_tokens(c, 4, 20);
    const at::Tensor batched = model->forward(tokens);
    for (int64_t b = 0; b < 4; ++b) {
      EXPECT_LT(max_diff(batched[b], model->forward(tokens.narrow(0, b, 1))[0]), 1e-5) << preset;
    }
  }
}

TEST(ModelForward, SdpaMatchesFallback) {
  for (const char* preset : {"tiny", "tiny-llama"}) {
    torch::manual_seed(2);
    const ModelConfig c = model_preset(preset);
    Transformer model(c);
    torch::NoGradGuard no_grad;
    const at::Tensor tokens = random_tokens(c, 3, c.context_length);
    model->set_attention(AttentionKernel::kFused);
    const at::Tensor fused = model->forward(tokens);
    model->set_attention(AttentionKernel::kReference);
    EXPECT_LE(max_diff(fused, model->forward(tokens)), 1e-5) << preset;
  }
}

TEST(ModelForward, RopeMatchesCosSinFormula) {
  const int64_t t = 12, hd = 8;
  const double theta = 10000.0;
  const auto tables = detail::rope_tables(t, hd, theta, at::kDouble);
  const at::Tensor x = at::randn({2, 3, t, hd}, at::kDouble);
  const at::Tensor rotated = detail::apply_rope(x, tables.first, tables.second);
  for (int64_t pos = 0; pos < t; ++pos) {
    for (int64_t j = 0; j < hd / 2; ++j) {
      const double angle = pos / std::pow(theta, 2.0 * j / hd);
      const at::Tensor a = x.select(2, pos).select(-1, j),
                       b = x.select(2, pos).select(-1, j + hd / 2);
      EXPECT_LT(
          max_diff(rotated.select(2, pos).select(-1, j), a * std::cos(angle) - b * std::sin(angle)),
          1e-12);
      EXPECT_LT(max_diff(rotated.select(2, pos).select(-1, j + hd / 2),
                         b * std::cos(angle) + a * std::sin(angle)),
                1e-12);
    }
  }
}

TEST(ModelForward, RopeScoresDependOnlyOnRelativePosition) {
  const int64_t t = 16, hd = 16;
  const auto tables = detail::rope_tables(t, hd, 10000.0, at::kDouble);
  // The same query and key vector at every position: a score can only vary with the offset.
  const at::Tensor q = at::randn({1, hd}, at::kDouble).expand({t, hd});
  const at::Tensor k = at::randn({1, hd}, at::kDouble).expand({t, hd});
  const at::Tensor scores = at::matmul(detail::apply_rope(q, tables.first, tables.second),
                                       detail::apply_rope(k, tables.first, tables.second).t());
  for (int64_t m = 0; m + 1 < t; ++m) {
    for (int64_t n = 0; n + 1 < t; ++n) {
      EXPECT_NEAR(scores[m][n].item<double>(), scores[m + 1][n + 1].item<double>(), 1e-10);
    }
  }
  EXPECT_GT(std::abs(scores[5][0].item<double>() - scores[5][4].item<double>()), 1e-6);
}

TEST(ModelForward, GroupedQueryAttentionEqualsRepeatedKvHeads) {
  torch::manual_seed(3);
  const ModelConfig gqa_config = model_preset("tiny-llama");
  ModelConfig mha_config = gqa_config;
  mha_config.n_kv_heads = mha_config.n_heads;
  Transformer gqa(gqa_config), mha(mha_config);
  const int64_t group = gqa_config.n_heads / gqa_config.n_kv_heads;
  const int64_t hd = gqa_config.d_model / gqa_config.n_heads;
  {
    torch::NoGradGuard no_grad;
    const auto source = gqa->named_parameters();
    for (auto& item : mha->named_parameters()) {
      at::Tensor w = source[item.key()];
      if (item.value().sizes() != w.sizes()) {  // k and v: repeat each kv head's rows per group
        w = w.view({gqa_config.n_kv_heads, hd, -1})
                .repeat_interleave(group, 0)
                .reshape(item.value().sizes());
      }
      item.value().copy_(w);
    }
  }
  torch::NoGradGuard no_grad;
  const at::Tensor tokens = random_tokens(gqa_config, 2, 30);
  EXPECT_LT(max_diff(gqa->forward(tokens), mha->forward(tokens)), 1e-5);
}

TEST(ModelForward, RefusesSequenceLongerThanContext) {
  Transformer model(model_preset("tiny"));
  try {
    model->forward(at::zeros({1, 80}, at::kLong));
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "sequence length 80 exceeds the model's context length 64");
  }
  EXPECT_NO_THROW(model->forward(at::zeros({1, 64}, at::kLong)));
}

TEST(ModelForward, RefusesBadTokens) {
  Transformer model(model_preset("tiny-llama"));
  at::Tensor tokens = at::zeros({2, 8}, at::kLong);
  tokens[1][3] = 300;
  try {
    model->forward(tokens);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("token id 300 at [1, 3]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("257"), std::string::npos) << msg;
  }
  tokens[1][3] = -1;
  EXPECT_THROW(model->forward(tokens), std::invalid_argument);
  EXPECT_THROW(model->forward(at::zeros({8}, at::kLong)), std::invalid_argument);
  EXPECT_THROW(model->forward(at::zeros({1, 8}, at::kInt)), std::invalid_argument);
}

TEST(ModelForward, InitializationIsDeterministicAndScaled) {
  const ModelConfig c = model_preset("tiny");
  torch::manual_seed(7);
  Transformer a(c);
  torch::manual_seed(7);
  Transformer b(c);
  const auto pa = a->named_parameters(), pb = b->named_parameters();
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_TRUE(at::equal(pa[i].value(), pb[i].value())) << pa[i].key();
  EXPECT_TRUE(at::equal(pa["blocks.0.ln1.weight"], at::ones({c.d_model})));
  EXPECT_TRUE(at::equal(pa["blocks.0.attn.qkv.bias"], at::zeros({3 * c.d_model})));
  EXPECT_NEAR(pa["tok_emb.weight"].std().item<double>(), 0.02, 0.001);
  EXPECT_NEAR(pa["blocks.1.mlp.proj.weight"].std().item<double>(), 0.02 / std::sqrt(4.0), 0.001);
}

}  // namespace forward_test
}  // namespace shardtrain
