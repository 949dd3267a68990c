// LAMB, 1-bit Adam and the compressed all-reduce against the formulas they implement, computed
// here element by element in double precision.
#include "shardtrain/optimizers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <vector>

#include "comm/compressed_all_reduce.h"
#include "shardtrain/rendezvous.h"

namespace shardtrain {
namespace optimizers_test {

using Values = std::vector<double>;

at::Tensor tensor_of(const Values& v, std::vector<int64_t> shape) {
  return at::tensor(v, at::kDouble).to(at::kFloat).reshape(shape);
}

Values values_of(const at::Tensor& t) {
  const at::Tensor d = t.detach().to(at::kDouble).contiguous().reshape({-1});
  return Values(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

double norm(const Values& v) {
  double sum = 0;
  for (double x : v) sum += x * x;
  return std::sqrt(sum);
}

void expect_near(const Values& got, const Values& want, double tolerance) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tolerance * (1 + std::abs(want[i]))) << "element " << i;
  }
}

// The gradient of parameter `which` at step `t`: a fixed pattern of mixed signs.
Values gradient(int which, int t, size_t n) {
  Values g(n);
  for (size_t i = 0; i < n; ++i) g[i] = std::sin(1.0 + 0.7 * i + 1.3 * t + 2.1 * which) * 0.5;
  return g;
}

struct Moments {
  Values m, v;
};

// One LAMB step of `p` as the header's formula says.
double lamb_reference(Values& p, Moments& s, const Values& g, int t, double lr, double wd,
                      double min_coeff, double max_coeff, bool bias_correction) {
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  Values u(p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    s.m[i] = b1 * s.m[i] + (1 - b1) * g[i];
    s.v[i] = b2 * s.v[i] + (1 - b2) * g[i] * g[i];
    u[i] = s.m[i] / (std::sqrt(s.v[i]) + eps) + wd * p[i];
  }
  const double w_norm = norm(p), u_norm = norm(u);
  double ratio = 1;
  if (w_norm != 0 && u_norm != 0) ratio = std::min(max_coeff, std::max(min_coeff, w_norm / u_norm));
  const double step =
      bias_correction ? lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t)) : lr;
  for (size_t i = 0; i < p.size(); ++i) p[i] -= step * ratio * u[i];
  return ratio;
}

TEST(Lamb, FollowsTheTrustRatioFormula) {
  for (const bool bias_correction : {true, false}) {
    SCOPED_TRACE(bias_correction ? "bias correction" : "no bias correction");
    // A decayed matrix, an undecayed vector, and a zero vector (ratio 1: ||p|| is 0).
    Values w = {3, -2, 5, 1, -4, 2.5}, b = {0.05, -0.1, 0.2}, z = {0, 0, 0};
    at::Tensor tw = tensor_of(w, {2, 3}).requires_grad_(), tb = tensor_of(b, {3}).requires_grad_(),
               tz = tensor_of(z, {3}).requires_grad_();
    const double lr = 0.01, wd = 0.1, min_coeff = 0.01, max_coeff = 0.3;
    auto options = torch::optim::AdamWOptions(lr).betas({0.9, 0.999}).eps(1e-8);
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<at::Tensor>{tw},
                        std::make_unique<torch::optim::AdamWOptions>(
                            torch::optim::AdamWOptions(options).weight_decay(wd)));
    groups.emplace_back(std::vector<at::Tensor>{tb, tz},
                        std::make_unique<torch::optim::AdamWOptions>(
                            torch::optim::AdamWOptions(options).weight_decay(0)));
    Lamb lamb(std::move(groups), options, LambOptions{min_coeff, max_coeff, bias_correction});
    Moments sw{Values(6), Values(6)}, sb{Values(3), Values(3)}, sz{Values(3), Values(3)};
    for (int t = 1; t <= 4; ++t) {
      const Values gw = gradient(0, t, 6), gb = gradient(1, t, 3), gz = gradient(2, t, 3);
      tw.mutable_grad() = tensor_of(gw, {2, 3});
      tb.mutable_grad() = tensor_of(gb, {3});
      tz.mutable_grad() = tensor_of(gz, {3});
      lamb.step();
      const double rw = lamb_reference(w, sw, gw, t, lr, wd, min_coeff, max_coeff, bias_correction);
      const double rb = lamb_reference(b, sb, gb, t, lr, 0, min_coeff, max_coeff, bias_correction);
      const double rz = lamb_reference(z, sz, gz, t, lr, 0, min_coeff, max_coeff, bias_correction);
      ASSERT_EQ(lamb.last_ratios().size(), 3u);
      EXPECT_NEAR(lamb.last_ratios()[0], rw, 1e-5);
      EXPECT_NEAR(lamb.last_ratios()[1], rb, 1e-5);
      EXPECT_NEAR(lamb.last_ratios()[2], rz, 1e-5);
      expect_near(values_of(tw), w, 1e-5);
      expect_near(values_of(tb), b, 1e-5);
      expect_near(values_of(tz), z, 1e-5);
    }
    // The clamp acted: the matrix's ratio is held at max_coeff, the zero vector's first is 1.
    EXPECT_EQ(lamb.last_ratios()[0], max_coeff);
  }
}

TEST(Lamb, RefusesCoefficientsOutOfOrder) {
  at::Tensor p = at::zeros({2}).requires_grad_();
  EXPECT_THROW(Lamb({torch::optim::OptimizerParamGroup({p})}, torch::optim::AdamWOptions(0.1),
                    LambOptions{0.5, 0.1, true}),
               std::invalid_argument);
}

// What every member gets from one compressed_all_reduce with no carried error, computed here
// from every member's input.
Values compressed_reference(const std::vector<Values>& inputs) {
  const size_t size = inputs.size(), n = inputs[0].size();
  const size_t unit = 8 * size, padded = (n + unit - 1) / unit * unit, chunk = padded / size;
  auto sign = [](double x) { return x >= 0 ? 1.0 : -1.0; };
  std::vector<Values> signs(size, Values(padded));
  Values scales(size);
  for (size_t r = 0; r < size; ++r) {
    Values x(padded, 0.0);
    std::copy(inputs[r].begin(), inputs[r].end(), x.begin());
    scales[r] = norm(x) / std::sqrt(static_cast<double>(padded));
    for (size_t i = 0; i < padded; ++i) signs[r][i] = sign(x[i]);
  }
  Values out(padded);
  for (size_t c = 0; c < size; ++c) {
    Values averaged(chunk);
    for (size_t i = 0; i < chunk; ++i) {
      for (size_t r = 0; r < size; ++r) averaged[i] += scales[r] * signs[r][c * chunk + i];
      averaged[i] /= static_cast<double>(size);
    }
    const double scale = norm(averaged) / std::sqrt(static_cast<double>(chunk));
    for (size_t i = 0; i < chunk; ++i) out[c * chunk + i] = scale * sign(averaged[i]);
  }
  out.resize(n);
  return out;
}

Values member_input(int rank, size_t n) {
  Values x(n);
  for (size_t i = 0; i < n; ++i) x[i] = std::cos(0.9 * i + 2.3 * rank) + 0.1 * rank;
  return x;
}

class CompressedAllReduce : public ::testing::TestWithParam<int> {};

TEST_P(CompressedAllReduce, EveryMemberGetsTheTwiceCompressedAverage) {
  const int size = GetParam();
  const size_t n = 37;  // not a multiple of 8 x size: padded
  std::vector<Values> inputs;
  for (int r = 0; r < size; ++r) inputs.push_back(member_input(r, n));
  const Values want = compressed_reference(inputs);
  // The CPU's fused loops, and the tensor operations other devices run.
  for (const bool tensor_ops : {false, true}) {
    SCOPED_TRACE(tensor_ops ? "tensor operations" : "fused CPU loops");
    std::mutex mutex;
    std::vector<Values> got(size);
    run_local_ranks(size, [&](ProcessGroup& group) {
      at::Tensor x = tensor_of(inputs[group.rank()], {static_cast<int64_t>(n)});
      CompressionErrors errors;
      if (tensor_ops) {
        detail::compressed_all_reduce_by_tensor_ops(group, x, errors);
      } else {
        compressed_all_reduce(group, x, errors);
      }
      std::lock_guard<std::mutex> lock(mutex);
      got[group.rank()] = values_of(x);
    });
    for (int r = 0; r < size; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      expect_near(got[r], want, 1e-5);
      EXPECT_EQ(got[r], got[0]);
    }
  }
}

TEST_P(CompressedAllReduce, ErrorFeedbackConvergesToTheTrueAverage) {
  // The same inputs averaged again and again: what one call loses is carried into the next, so
  // the mean of the results approaches the exact average although each call is 1-bit.
  const int size = GetParam();
  const size_t n = 64;
  Values exact(n);
  for (int r = 0; r < size; ++r) {
    const Values x = member_input(r, n);
    for (size_t i = 0; i < n; ++i) exact[i] += x[i] / size;
  }
  const int calls = 200;
  std::mutex mutex;
  double first_error = 0, mean_error = 0;
  run_local_ranks(size, [&](ProcessGroup& group) {
    CompressionErrors errors;
    Values sum(n);
    double first = 0;
    for (int k = 0; k < calls; ++k) {
      at::Tensor x = tensor_of(member_input(group.rank(), n), {static_cast<int64_t>(n)});
      compressed_all_reduce(group, x, errors);
      const Values got = values_of(x);
      Values diff(n);
      for (size_t i = 0; i < n; ++i) {
        sum[i] += got[i];
        diff[i] = got[i] - exact[i];
      }
      if (k == 0) first = norm(diff) / norm(exact);
    }
    Values diff(n);
    for (size_t i = 0; i < n; ++i) diff[i] = sum[i] / calls - exact[i];
    if (group.rank() == 0) {
      std::lock_guard<std::mutex> lock(mutex);
      first_error = first;
      mean_error = norm(diff) / norm(exact);
    }
  });
  EXPECT_GT(first_error, 0.1);  // one call alone is far off
  EXPECT_LT(mean_error, 0.03);
}

INSTANTIATE_TEST_SUITE_P(Ranks, CompressedAllReduce, ::testing::Values(2, 3));

// 1-bit Adam's update of one parameter, as the header's formula says: Adam without bias
// corrections for freeze_step updates, then the variance frozen.
void onebit_reference(Values& p, Moments& s, const Values& g, int t, int freeze_step, double lr,
                      double wd) {
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  for (size_t i = 0; i < p.size(); ++i) {
    s.m[i] = b1 * s.m[i] + (1 - b1) * g[i];
    if (t <= freeze_step) s.v[i] = b2 * s.v[i] + (1 - b2) * g[i] * g[i];
    p[i] -= lr * (s.m[i] / (std::sqrt(s.v[i]) + eps) + wd * p[i]);
  }
}

TEST(OneBitAdam, WarmsUpAsAdamThenFreezesTheVariance) {
  Values w = {0.3, -0.2, 0.5, 0.1};
  at::Tensor tw = tensor_of(w, {4}).requires_grad_();
  const double lr = 0.01, wd = 0.1;
  OneBitAdam adam({torch::optim::OptimizerParamGroup({tw})},
                  torch::optim::AdamWOptions(lr).betas({0.9, 0.999}).eps(1e-8).weight_decay(wd),
                  /*freeze_step=*/2);
  Moments s{Values(4), Values(4)};
  for (int t = 1; t <= 5; ++t) {
    EXPECT_EQ(adam.compressing(), t > 2) << "before update " << t;
    const Values g = gradient(0, t, 4);
    tw.mutable_grad() = tensor_of(g, {4});
    adam.step();
    onebit_reference(w, s, g, t, 2, lr, wd);
    expect_near(values_of(tw), w, 1e-5);
    EXPECT_EQ(adam.updates(), t);
  }
}

TEST(OneBitAdam, CompressedMomentumKeepsReplicasEqual) {
  // Past the warmup each rank's gradients differ; the averaged momentum does not, so neither do
  // the parameters.
  std::mutex mutex;
  std::vector<Values> params(2);
  run_local_ranks(2, [&](ProcessGroup& group) {
    at::Tensor p =
        tensor_of({0.3, -0.2, 0.5, 0.1, 0.7, -0.6, 0.2, 0.05, -0.3}, {9}).requires_grad_();
    OneBitAdam adam({torch::optim::OptimizerParamGroup({p})},
                    torch::optim::AdamWOptions(0.01).weight_decay(0), /*freeze_step=*/1);
    adam.set_group(&group);
    for (int t = 1; t <= 4; ++t) {
      // The warmup's gradients are averaged ones, the same on both ranks; after it, each its own.
      p.mutable_grad() = tensor_of(gradient(t > 1 ? group.rank() : 0, t, 9), {9});
      adam.step();
    }
    std::lock_guard<std::mutex> lock(mutex);
    params[group.rank()] = values_of(p);
  });
  EXPECT_EQ(params[0], params[1]);
}

// 0/1 Adam on one rank, as the header's formula says (one rank averages nothing, so the
// compressed averages are the values themselves). `interval` is the variance interval,
// `local` the local-step one.
struct ZeroOneState {
  Values m, v, buffer;
  int var_interval = 1, var_counter = 0, local_interval = 1, local_counter = 0;
  double lr_sum = 0;
};

void zero_one_reference(Values& p, ZeroOneState& s, const Values& g, int t,
                        const ZeroOneAdamOptions& o, double lr, double wd) {
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  if (t == 1) return;
  const bool frozen = t - 1 > o.var_freeze_step;
  const bool variance = !frozen && t % s.var_interval == 0;
  if (frozen) s.lr_sum += lr;
  for (size_t i = 0; i < p.size(); ++i) {
    s.m[i] = b1 * s.m[i] + (1 - b1) * g[i];
    if (variance) s.v[i] = b2 * s.v[i] + (1 - b2) * g[i] * g[i];
    if (!variance && !frozen && s.v[i] == 0) s.m[i] = 0;
    const double u = lr * (s.m[i] / (std::sqrt(s.v[i]) + eps) + wd * p[i]);
    p[i] -= u;
    if (frozen) s.buffer[i] -= u;
  }
  if (frozen && t % s.local_interval == 0) {
    for (size_t i = 0; i < p.size(); ++i) {
      const double d = std::sqrt(s.v[i]) + eps;
      p[i] -= s.buffer[i];
      const double exchanged = s.v[i] == 0 ? 0 : s.buffer[i] * d;
      s.m[i] = exchanged / -s.lr_sum;
      p[i] += exchanged / d;
      s.buffer[i] = 0;
    }
    s.lr_sum = 0;
  }
  if (variance && ++s.var_counter == o.var_update_scaler) {
    s.var_counter = 0;
    s.var_interval *= 2;
  }
  if (frozen && ++s.local_counter == o.local_step_scaler) {
    s.local_counter = 0;
    s.local_interval = std::min<int>(static_cast<int>(o.local_step_clipper), 2 * s.local_interval);
  }
}

TEST(ZeroOneAdam, AveragesAtDoublingVarianceIntervalsThenTakesLocalSteps) {
  const ZeroOneAdamOptions o{/*var_freeze_step=*/9, /*var_update_scaler=*/2,
                             /*local_step_scaler=*/2, /*local_step_clipper=*/4};
  Values w = {0.3, -0.2, 0.5, 0.1};
  at::Tensor tw = tensor_of(w, {4}).requires_grad_();
  const Values start = values_of(tw);
  const double lr = 0.01, wd = 0.1;
  ZeroOneAdam adam({torch::optim::OptimizerParamGroup({tw})},
                   torch::optim::AdamWOptions(lr).betas({0.9, 0.999}).eps(1e-8).weight_decay(wd),
                   o);
  ZeroOneState s{Values(4), Values(4), Values(4)};
  // Averaged gradients at steps 1 (DeepSpeed's initialization step), 2, 3 (interval 1), 4, 6
  // (interval 2), 8 (interval 4); none after the variance's last update (step 10 at most).
  const std::vector<int> averaged = {1, 2, 3, 4, 6, 8};
  for (int t = 1; t <= 20; ++t) {
    const bool expect_averaged = std::count(averaged.begin(), averaged.end(), t) > 0;
    EXPECT_EQ(adam.compressing(), !expect_averaged) << "before step " << t;
    const Values g = gradient(0, t, 4);
    tw.mutable_grad() = tensor_of(g, {4});
    adam.step();
    zero_one_reference(w, s, g, t, o, lr, wd);
    if (t == 1) {
      EXPECT_EQ(values_of(tw), start) << "the initialization step moved the parameter";
    }
    expect_near(values_of(tw), w, 1e-5);
  }
  // The local-step interval doubled twice (after 2 and 4 local steps) and stopped at 4.
  EXPECT_EQ(s.local_interval, 4);
  const auto extra = adam.extra_state(tw);
  ASSERT_EQ(extra.size(), 2u);
  EXPECT_EQ(extra[1].second[2].item<double>(), 4.0);  // the local-step interval, checkpointed
}

TEST(ZeroOneAdam, CompressedAveragesAndExchangesKeepReplicasEqual) {
  // Gradients differ per rank except at the variance updates (which the trainer averages).
  // Every local step is exchanged (clipper 1), so the replicas agree after every step.
  const ZeroOneAdamOptions o{/*var_freeze_step=*/4, /*var_update_scaler=*/1,
                             /*local_step_scaler=*/100, /*local_step_clipper=*/1};
  std::mutex mutex;
  std::vector<Values> params(2);
  run_local_ranks(2, [&](ProcessGroup& group) {
    at::Tensor p =
        tensor_of({0.3, -0.2, 0.5, 0.1, 0.7, -0.6, 0.2, 0.05, -0.3}, {9}).requires_grad_();
    ZeroOneAdam adam({torch::optim::OptimizerParamGroup({p})},
                     torch::optim::AdamWOptions(0.01).weight_decay(0.01), o);
    adam.set_group(&group);
    for (int t = 1; t <= 9; ++t) {
      const bool averaged = !adam.compressing();
      p.mutable_grad() = tensor_of(gradient(averaged ? 0 : group.rank(), t, 9), {9});
      adam.step();
    }
    std::lock_guard<std::mutex> lock(mutex);
    params[group.rank()] = values_of(p);
  });
  EXPECT_EQ(params[0], params[1]);
}

TEST(ZeroOneAdam, RefusesIntervalsBelowOne) {
  at::Tensor p = at::zeros({2}).requires_grad_();
  EXPECT_THROW(ZeroOneAdam({torch::optim::OptimizerParamGroup({p})},
                           torch::optim::AdamWOptions(0.01), ZeroOneAdamOptions{10, 0, 1, 1}),
               std::invalid_argument);
}

struct LambState {
  Values m, v, fresh;
  double coeff = 0, last_factor = 1;
};

// One 1-bit LAMB update of `p` on one process (nothing to average), as the header's formulas say.
double onebit_lamb_reference(Values& p, LambState& s, const Values& g, int t, int freeze_step,
                             double lr, double wd, const OneBitLambOptions& o) {
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  const size_t n = p.size();
  if (t <= freeze_step) {
    Values u(n);
    for (size_t i = 0; i < n; ++i) {
      s.m[i] = b1 * s.m[i] + (1 - b1) * g[i];
      s.v[i] = b2 * s.v[i] + (1 - b2) * g[i] * g[i];
      u[i] = s.m[i] / (std::sqrt(s.v[i]) + eps) + wd * p[i];
    }
    if (t == freeze_step) s.fresh = s.v;
    double ratio = 1;
    if (norm(p) != 0 && norm(u) != 0)
      ratio = std::min(o.max_coeff, std::max(o.min_coeff, norm(p) / norm(u)));
    if (ratio != 1) s.coeff = o.coeff_beta * s.coeff + (1 - o.coeff_beta) * ratio;
    for (size_t i = 0; i < n; ++i) p[i] -= lr * ratio * u[i];
    return ratio;
  }
  Values prelim(n), u(n);
  double factor = 0;
  for (size_t i = 0; i < n; ++i) {
    s.m[i] = b1 * s.m[i] + (1 - b1) * g[i];
    // One process: the momentum is its own average, and the gradient it implies is g.
    s.fresh[i] = b2 * s.fresh[i] + (1 - b2) * g[i] * g[i];
    const double denom = std::sqrt(s.v[i]) + eps;
    prelim[i] = s.m[i] / denom;
    u[i] = prelim[i] + wd * p[i];
    factor = std::max(factor, denom / (std::sqrt(s.fresh[i]) + eps));
  }
  if (wd > 0) {
    const double share = std::min(1.0, norm(prelim) / norm(u));
    factor = factor * share + (1 - share);
  }
  factor = std::min(o.factor_max, std::max(o.factor_min, factor));
  factor = std::min(factor, s.last_factor * (1 + o.factor_threshold));
  factor = std::max(factor, s.last_factor * (1 - o.factor_threshold));
  s.last_factor = factor;
  for (size_t i = 0; i < n; ++i) p[i] -= lr * s.coeff * factor * u[i];
  return s.coeff * factor;
}

TEST(OneBitLamb, FreezesItsRatioAfterTheWarmupAndScalesItByTheVarianceFactor) {
  Values w = {3, -2, 5, 1, -4, 2.5}, b = {0.05, -0.1, 0.2};
  at::Tensor tw = tensor_of(w, {2, 3}).requires_grad_(), tb = tensor_of(b, {3}).requires_grad_();
  const double lr = 0.01, wd = 0.1;
  OneBitLambOptions options;
  options.freeze_step = 3;
  options.max_coeff = 0.3;
  auto adam = torch::optim::AdamWOptions(lr).betas({0.9, 0.999}).eps(1e-8);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{tw},
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(adam).weight_decay(wd)));
  groups.emplace_back(std::vector<at::Tensor>{tb},
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(adam).weight_decay(0)));
  OneBitLamb lamb(std::move(groups), adam, options);
  LambState sw{Values(6), Values(6), Values(6)}, sb{Values(3), Values(3), Values(3)};
  for (int t = 1; t <= 7; ++t) {
    SCOPED_TRACE("update " + std::to_string(t));
    EXPECT_EQ(lamb.compressing(), t > 3);
    const Values gw = gradient(0, t, 6), gb = gradient(1, t, 3);
    tw.mutable_grad() = tensor_of(gw, {2, 3});
    tb.mutable_grad() = tensor_of(gb, {3});
    lamb.step();
    const double cw = onebit_lamb_reference(w, sw, gw, t, 3, lr, wd, options);
    const double cb = onebit_lamb_reference(b, sb, gb, t, 3, lr, 0, options);
    ASSERT_EQ(lamb.last_coefficients().size(), 2u);
    EXPECT_NEAR(lamb.last_coefficients()[0], cw, 1e-5);
    EXPECT_NEAR(lamb.last_coefficients()[1], cb, 1e-5);
    expect_near(values_of(tw), w, 1e-5);
    expect_near(values_of(tb), b, 1e-5);
  }
  // The state a checkpoint keeps beyond AdamW's.
  const auto extra = lamb.extra_state(tw);
  ASSERT_EQ(extra.size(), 4u);
  EXPECT_EQ(extra[0].first, "exp_avg_sq_fresh");
  expect_near(values_of(extra[0].second), sw.fresh, 1e-5);
  EXPECT_NEAR(extra[2].second.item<double>(), sw.last_factor, 1e-6);
}

TEST(OneBitLamb, CompressedMomentumKeepsReplicasEqual) {
  std::mutex mutex;
  std::vector<Values> params(2);
  run_local_ranks(2, [&](ProcessGroup& group) {
    at::Tensor a =
        tensor_of({0.3, -0.2, 0.5, 0.1, 0.7, -0.6, 0.2, 0.05, -0.3}, {9}).requires_grad_();
    at::Tensor b = tensor_of({1.5, -0.5, 0.25}, {3}).requires_grad_();
    OneBitLambOptions options;
    options.freeze_step = 2;
    OneBitLamb lamb({torch::optim::OptimizerParamGroup({a, b})},
                    torch::optim::AdamWOptions(0.01).weight_decay(0.01), options);
    lamb.set_group(&group);
    for (int t = 1; t <= 5; ++t) {
      const int source = t > 2 ? group.rank() : 0;  // averaged gradients in the warmup only
      a.mutable_grad() = tensor_of(gradient(source, t, 9), {9});
      b.mutable_grad() = tensor_of(gradient(source + 5, t, 3), {3});
      lamb.step();
    }
    std::lock_guard<std::mutex> lock(mutex);
    params[group.rank()] = values_of(at::cat({a, b}));
  });
  EXPECT_EQ(params[0], params[1]);
}

}  // namespace optimizers_test
}  // namespace shardtrain
