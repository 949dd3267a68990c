// fp8 emulation: rounding to E4M3 and E5M2 (every value of each format kept, every midpoint
// rounded to the even neighbour, saturation, subnormals, NaN), the layer's product and
// gradients against the formula on the rounded values, and Transformer Engine's delayed scaling
// (the history's max or the last amax, the margin, amax 0 keeping the scale, the max over ranks).
#include "model/fp8.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <vector>

#include "model/layers.h"

namespace shardtrain {
namespace fp8_test {

using detail::Fp8Format;

// Every finite non-negative value of a format: exponent field e (0: subnormal), mantissa m.
std::vector<double> all_values(Fp8Format format) {
  const int mantissa_bits = format == Fp8Format::kE4M3 ? 3 : 2;
  const int bias = format == Fp8Format::kE4M3 ? 7 : 15;
  const int top = format == Fp8Format::kE4M3 ? 15 : 30;  // E5M2's 31 is inf and NaN
  std::vector<double> values;
  for (int e = 0; e <= top; ++e) {
    for (int m = 0; m < (1 << mantissa_bits); ++m) {
      // E4M3 has no infinities; its one NaN is exponent 15, mantissa 7.
      if (format == Fp8Format::kE4M3 && e == 15 && m == 7) continue;
      const double fraction = static_cast<double>(m) / (1 << mantissa_bits);
      values.push_back(e == 0 ? std::ldexp(fraction, 1 - bias)
                              : std::ldexp(1.0 + fraction, e - bias));
    }
  }
  return values;
}

class Fp8Rounding : public ::testing::TestWithParam<Fp8Format> {};

TEST_P(Fp8Rounding, KeepsEveryValueRoundsMidpointsToEvenAndSaturates) {
  const Fp8Format format = GetParam();
  const std::vector<double> values = all_values(format);
  EXPECT_EQ(values.back(), detail::fp8_max(format));
  const at::Tensor exact = torch::tensor(values, at::kDouble);
  for (const double sign : {1.0, -1.0}) {
    EXPECT_TRUE(detail::round_to_fp8(exact * sign, format).to(at::kDouble).equal(exact * sign));
  }
  // Each midpoint goes to the neighbour with an even mantissa (the even index), and just past it
  // to the upper one.
  std::vector<double> midpoints, want_mid, above, want_above;
  for (size_t i = 0; i + 1 < values.size(); ++i) {
    const double mid = (values[i] + values[i + 1]) / 2;
    midpoints.push_back(mid);
    want_mid.push_back(i % 2 == 0 ? values[i] : values[i + 1]);
    above.push_back(std::nextafter(static_cast<float>(mid), 1e9f));
    want_above.push_back(values[i + 1]);
  }
  EXPECT_TRUE(detail::round_to_fp8(torch::tensor(midpoints, at::kDouble), format)
                  .to(at::kDouble)
                  .equal(torch::tensor(want_mid, at::kDouble)));
  EXPECT_TRUE(detail::round_to_fp8(torch::tensor(above, at::kDouble), format)
                  .to(at::kDouble)
                  .equal(torch::tensor(want_above, at::kDouble)));
  // Past the largest value, and infinities, saturate; NaN stays.
  const double max = detail::fp8_max(format);
  const at::Tensor big = torch::tensor(
      {max * 1.5, -max * 4, std::numeric_limits<double>::infinity(), std::nan("")}, at::kFloat);
  const at::Tensor got = detail::round_to_fp8(big, format);
  EXPECT_EQ(got[0].item<double>(), max);
  EXPECT_EQ(got[1].item<double>(), -max);
  EXPECT_EQ(got[2].item<double>(), max);
  EXPECT_TRUE(std::isnan(got[3].item<double>()));
  // Below half the smallest subnormal: zero.
  const double smallest = values[1];
  EXPECT_EQ(
      detail::round_to_fp8(torch::tensor({smallest * 0.49}, at::kFloat), format).item<double>(),
      0.0);
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8Rounding,
                         ::testing::Values(Fp8Format::kE4M3, Fp8Format::kE5M2),
                         [](const auto& info) {
                           return info.param == Fp8Format::kE4M3 ? "E4M3" : "E5M2";
                         });

std::shared_ptr<detail::Fp8Recipe> recipe(bool hybrid, int64_t history, bool most_recent,
                                          int64_t margin = 0) {
  auto r = std::make_shared<detail::Fp8Recipe>();
  r->hybrid = hybrid;
  r->history = history;
  r->most_recent = most_recent;
  r->margin = margin;
  return r;
}

TEST(Fp8Linear, ComputesWithTheRoundedValuesAtTheScalesAndRecordsTheirMagnitudes) {
  torch::manual_seed(11);
  detail::Fp8Scaling scaling(recipe(true, 4, false));
  scaling.scale.copy_(torch::tensor({8.0f, 64.0f, 1024.0f}));
  const at::Tensor x = torch::randn({2, 3, 16}).requires_grad_();
  const at::Tensor w = (torch::randn({5, 16}) * 0.1).requires_grad_();
  const at::Tensor b = torch::randn({5}).requires_grad_();
  const at::Tensor y = detail::fp8_linear(x, w, b, scaling);
  const at::Tensor qx = detail::round_to_fp8(x.detach() * 8, Fp8Format::kE4M3);
  const at::Tensor qw = detail::round_to_fp8(w.detach() * 64, Fp8Format::kE4M3);
  EXPECT_TRUE(torch::allclose(y, at::matmul(qx, qw.t()) / 512 + b.detach(), 1e-6, 1e-6));
  EXPECT_FALSE(torch::allclose(y, at::linear(x, w, b), 1e-4, 1e-4));  // the rounding shows
  const at::Tensor g = torch::randn({2, 3, 5}) * 1e-3;
  y.backward(g);
  const at::Tensor qg = detail::round_to_fp8(g * 1024, Fp8Format::kE5M2);  // hybrid: E5M2
  EXPECT_TRUE(torch::allclose(x.grad(), at::matmul(qg, qw) / (1024 * 64), 1e-6, 1e-8));
  EXPECT_TRUE(torch::allclose(
      w.grad(), at::matmul(qg.reshape({-1, 5}).t(), qx.reshape({-1, 16})) / (1024 * 8), 1e-6,
      1e-8));
  EXPECT_TRUE(
      torch::allclose(b.grad(), g.sum(std::vector<int64_t>{0, 1}), 1e-6, 1e-8));  // unrounded
  const at::Tensor want_amax =
      torch::stack({x.detach().abs().max(), w.detach().abs().max(), g.abs().max()});
  EXPECT_TRUE(scaling.amax.equal(want_amax));
}

TEST(Fp8Linear, RunsUnderAutocastToTheAutocastDtypeAndOnlyInTraining) {
  torch::manual_seed(12);
  detail::Linear layer(16, 8, true, false);
  {
    torch::NoGradGuard no_grad;
    layer->weight.normal_(0, 0.1);
    layer->bias.normal_();
  }
  layer->fp8 = std::make_shared<detail::Fp8Scaling>(recipe(false, 1, true));
  const at::Tensor x = torch::randn({4, 16});
  layer->train();
  const at::Tensor trained = layer->forward(x);
  {
    torch::NoGradGuard no_grad;
    at::autocast::set_cpu_enabled(true);
    const at::Tensor autocast = layer->forward(x);
    at::autocast::set_cpu_enabled(false);
    at::autocast::clear_cache();
    EXPECT_EQ(autocast.scalar_type(), at::kBFloat16);
    // The same fp32 result, rounded once to bf16.
    EXPECT_TRUE(autocast.equal(trained.detach().to(at::kBFloat16)));
  }
  layer->eval();
  EXPECT_TRUE(torch::allclose(layer->forward(x), at::linear(x, layer->weight, layer->bias), 0, 0));
}

TEST(Fp8Scaling, ScalesFollowTheHistoryTheMarginAndKeepTheirValueWithoutAnAmax) {
  const std::vector<std::shared_ptr<detail::Fp8Scaling>> layers = {
      std::make_shared<detail::Fp8Scaling>(recipe(true, 3, true)),
      std::make_shared<detail::Fp8Scaling>(recipe(false, 2, false, 1))};
  detail::Fp8Scaling& most_recent = *layers[0];
  detail::Fp8Scaling& history_max = *layers[1];
  auto step = [&](std::vector<float> a, std::vector<float> b) {
    most_recent.amax.copy_(torch::tensor(a));
    history_max.amax.copy_(torch::tensor(b));
    detail::update_fp8_scales(layers, nullptr);
  };
  step({4, 2, 0}, {8, 1, 16});
  // 448 / amax (E5M2's 57344 for the hybrid gradient); amax 0 keeps the scale (1).
  EXPECT_TRUE(most_recent.scale.equal(torch::tensor({112.0f, 224.0f, 1.0f})));
  // Margin 1 halves; E4M3 for the gradient too.
  EXPECT_TRUE(history_max.scale.equal(torch::tensor({28.0f, 224.0f, 14.0f})));
  EXPECT_TRUE(most_recent.amax.equal(torch::zeros({3})));  // the next step starts again
  step({1, 1, 7}, {2, 4, 1});
  EXPECT_TRUE(most_recent.scale.equal(torch::tensor({448.0f, 448.0f, 57344.0f / 7})));
  // The max over the last 2 steps: {8, 4, 16}.
  EXPECT_TRUE(history_max.scale.equal(torch::tensor({28.0f, 56.0f, 14.0f})));
  step({1, 1, 1}, {2, 2, 2});
  // Step 1 has left the 2-step history: max {2, 4, 2}.
  EXPECT_TRUE(history_max.scale.equal(torch::tensor({112.0f, 56.0f, 112.0f})));
  // A non-finite amax keeps the scale too.
  step({std::numeric_limits<float>::infinity(), 1, 1}, {2, 2, 2});
  EXPECT_EQ(most_recent.scale[0].item<float>(), 448.0f);
}

}  // namespace fp8_test
}  // namespace shardtrain
