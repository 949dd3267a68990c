#include "shardtrain/fused_adamw.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "optim/adamw_kernel.h"
#include "optim/state_key.h"

namespace shardtrain {
namespace fused_adamw_test {

// Largest |a - b| / max(|b|, tiny) over the elements.
double max_relative(const at::Tensor& a, const at::Tensor& b) {
  const auto diff = (a.to(at::kDouble) - b.to(at::kDouble)).abs();
  return (diff / b.to(at::kDouble).abs().clamp_min(1e-30)).max().item<double>();
}

// The ISAs this CPU can run, each checked on its own below.
std::vector<detail::AdamIsa> runnable_isas() {
  std::vector<detail::AdamIsa> isas{detail::AdamIsa::kGeneric};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    isas.push_back(detail::AdamIsa::kAvx2);
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl")) {
    isas.push_back(detail::AdamIsa::kAvx512);
  }
  return isas;
}

// LibTorch's own optimizer as the reference for one update of a flat tensor: a fresh
// torch::optim::AdamW whose state is set to (m, v, step - 1) before stepping.
void torch_reference(at::Tensor& p, const at::Tensor& g, at::Tensor& m, at::Tensor& v,
                     const AdamWStep& h) {
  auto leaf = p.detach().clone().requires_grad_(true);
  leaf.mutable_grad() = g.clone();
  torch::optim::AdamW opt({leaf}, torch::optim::AdamWOptions(h.lr_)
                                      .betas({h.beta1_, h.beta2_})
                                      .eps(h.eps_)
                                      .weight_decay(h.weight_decay_));
  auto state = std::make_unique<torch::optim::AdamWParamState>();
  state->step(h.step_ - 1);
  state->exp_avg(m.clone());
  state->exp_avg_sq(v.clone());
  opt.state()[detail::optimizer_state_key(leaf)] = std::move(state);
  opt.step();
  auto& after = static_cast<torch::optim::AdamWParamState&>(*opt.state().begin()->second);
  p.copy_(leaf.detach());
  m.copy_(after.exp_avg());
  v.copy_(after.exp_avg_sq());
}

TEST(FusedAdamWTest, MatchesLibTorchAdamWOverAHundredSteps) {
  torch::manual_seed(3);
  // Odd shapes, two groups with different hyper-parameters, weight decay on in one.
  const std::vector<std::vector<int64_t>> shapes{{7, 13}, {33}, {1}, {5, 3, 2}, {257}};
  std::vector<at::Tensor> ours, theirs;
  for (const auto& shape : shapes) {
    auto init = torch::randn(shape);
    ours.push_back(init.clone().requires_grad_(true));
    theirs.push_back(init.clone().requires_grad_(true));
  }
  auto groups = [](const std::vector<at::Tensor>& p) {
    std::vector<torch::optim::OptimizerParamGroup> g;
    g.emplace_back(std::vector<at::Tensor>{p[0], p[3], p[4]},
                   std::make_unique<torch::optim::AdamWOptions>(
                       torch::optim::AdamWOptions(2e-3).weight_decay(0.1)));
    g.emplace_back(
        std::vector<at::Tensor>{p[1], p[2]},
        std::make_unique<torch::optim::AdamWOptions>(
            torch::optim::AdamWOptions(5e-3).betas({0.8, 0.95}).eps(1e-6).weight_decay(0)));
    return g;
  };
  FusedAdamW fused(groups(ours));
  torch::optim::AdamW reference(groups(theirs));
  for (int step = 0; step < 100; ++step) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      // Gradients of changing scale, so that both moments see large and small values.
      const auto g = torch::randn(shapes[i]) * std::pow(10.0, (step % 5) - 2);
      ours[i].mutable_grad() = g.clone();
      theirs[i].mutable_grad() = g.clone();
    }
    fused.step();
    reference.step();
  }
  const bool vector_isa = fused_adamw_isa() != "generic";
  for (size_t i = 0; i < shapes.size(); ++i) {
    EXPECT_LE(max_relative(ours[i], theirs[i]), 1e-6) << "param " << i;
    if (vector_isa) {
      EXPECT_TRUE(torch::equal(ours[i], theirs[i])) << "param " << i;
    }
    auto& a = static_cast<torch::optim::AdamWParamState&>(
        *fused.state().at(detail::optimizer_state_key(ours[i])));
    auto& b = static_cast<torch::optim::AdamWParamState&>(
        *reference.state().at(detail::optimizer_state_key(theirs[i])));
    EXPECT_EQ(a.step(), 100);
    EXPECT_LE(max_relative(a.exp_avg_sq(), b.exp_avg_sq()), 1e-6) << "param " << i;
    if (vector_isa) {
      EXPECT_TRUE(torch::equal(a.exp_avg(), b.exp_avg())) << "param " << i;
      EXPECT_TRUE(torch::equal(a.exp_avg_sq(), b.exp_avg_sq())) << "param " << i;
    }
  }
}

// Without bias correction (DeepSpeed's bias_correction = false) the update is
// p -= lr * m / (sqrt(v) + eps) from the first step: checked against that formula in double, for
// a parameter the kernel takes and one it does not (non-contiguous).
TEST(FusedAdamWTest, WithoutBiasCorrectionTheStepIsLrTimesMOverSqrtV) {
  torch::manual_seed(5);
  const auto init = torch::randn({64, 3});
  auto flat = init.clone().requires_grad_(true);
  auto strided = init.t().contiguous().t().requires_grad_(true);  // not contiguous
  ASSERT_FALSE(strided.is_contiguous());
  const double lr = 1e-2, b1 = 0.9, b2 = 0.99, eps = 1e-8, wd = 0.01;
  FusedAdamW opt({flat, strided},
                 torch::optim::AdamWOptions(lr).betas({b1, b2}).eps(eps).weight_decay(wd));
  opt.set_bias_correction(false);
  auto p = init.to(at::kDouble), m = torch::zeros_like(p), v = torch::zeros_like(p);
  for (int step = 0; step < 5; ++step) {
    const auto g = torch::randn({64, 3});
    flat.mutable_grad() = g.clone();
    strided.mutable_grad() = g.clone();
    opt.step();
    const auto gd = g.to(at::kDouble);
    p = p * (1 - lr * wd);
    m = b1 * m + (1 - b1) * gd;
    v = b2 * v + (1 - b2) * gd * gd;
    p = p - lr * m / (v.sqrt() + eps);
  }
  EXPECT_LT(max_relative(flat.detach(), p.to(at::kFloat)), 1e-5);
  EXPECT_LT(max_relative(strided.detach(), p.to(at::kFloat)), 1e-5);
  // The first step of a unit gradient with beta2 = 0.999: lr with the corrections, lr x 0.1 /
  // sqrt(0.001) (3.16 lr) without.
  for (bool correct : {true, false}) {
    auto q = init.clone().requires_grad_(true);
    FusedAdamW one({q}, torch::optim::AdamWOptions(lr).betas({0.9, 0.999}).eps(0).weight_decay(0));
    one.set_bias_correction(correct);
    q.mutable_grad() = torch::ones({64, 3});
    one.step();
    EXPECT_NEAR((init - q.detach()).abs().max().item<double>(),
                correct ? lr : lr * 0.1 / std::sqrt(0.001), 1e-6);
  }
}

TEST(FusedAdamWTest, EveryInstructionSetMatchesLibTorchOnOddSizes) {
  torch::manual_seed(5);
  const auto hyper = AdamWStep().lr(1e-2).weight_decay(0.05).step(3);
  for (const auto isa : runnable_isas()) {
    for (const int64_t n : {1, 7, 8, 15, 16, 17, 31, 1000}) {
      auto p = torch::randn({n}), g = torch::randn({n});
      auto m = torch::randn({n}) * 0.1, v = torch::rand({n}) * 0.01;
      auto rp = p.clone(), rm = m.clone(), rv = v.clone();
      torch_reference(rp, g, rm, rv, hyper);
      // A bf16 view 10 bytes past an aligned start: the kernel must reach alignment itself.
      auto bf16 = at::empty({n + 5}, at::kBFloat16).narrow(0, 5, n);
      detail::adamw_range(isa, detail::AdamWScalars::from(hyper), p.data_ptr<float>(),
                          g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(),
                          reinterpret_cast<uint16_t*>(bf16.data_ptr<at::BFloat16>()), n);
      const std::string where = std::string(detail::adam_isa_name(isa)) + " n=" + std::to_string(n);
      EXPECT_LE(max_relative(p, rp), 1e-6) << where;
      EXPECT_LE(max_relative(v, rv), 1e-6) << where;
      // Only the generic path rounds LibTorch's fused multiply-adds twice.
      if (isa != detail::AdamIsa::kGeneric) {
        EXPECT_TRUE(torch::equal(p, rp)) << where;
        EXPECT_TRUE(torch::equal(m, rm)) << where;
        EXPECT_TRUE(torch::equal(v, rv)) << where;
      }
      EXPECT_TRUE(torch::equal(bf16, p.to(at::kBFloat16))) << where;
    }
  }
}

TEST(FusedAdamWTest, UpdatesAViewOfAFlatShardAndNothingElse) {
  torch::manual_seed(7);
  auto flat_p = torch::randn({1000}), flat_g = torch::randn({1000});
  auto flat_m = torch::zeros({1000}), flat_v = torch::zeros({1000});
  const auto before = flat_p.clone();
  auto p = flat_p.narrow(0, 3, 517), m = flat_m.narrow(0, 3, 517), v = flat_v.narrow(0, 3, 517);
  const auto g = flat_g.narrow(0, 3, 517);
  auto rp = p.clone(), rm = m.clone(), rv = v.clone();
  const auto hyper = AdamWStep().lr(3e-3).weight_decay(0.01).step(1);
  torch_reference(rp, g, rm, rv, hyper);
  fused_adamw_step(flat_p.narrow(0, 3, 517), g, m, v, hyper);  // a temporary view works too
  EXPECT_LE(max_relative(p, rp), 1e-6);
  EXPECT_LE(max_relative(m, rm), 1e-6);
  EXPECT_TRUE(torch::equal(flat_p.narrow(0, 0, 3), before.narrow(0, 0, 3)));
  EXPECT_TRUE(torch::equal(flat_p.narrow(0, 520, 480), before.narrow(0, 520, 480)));
  EXPECT_EQ(flat_m.narrow(0, 520, 480).abs().sum().item<float>(), 0.0f);
}

TEST(FusedAdamWTest, ParametersTheKernelDoesNotTakeFollowLibTorch) {
  // fp64 parameters take LibTorch's own tensor operations inside FusedAdamW.
  torch::manual_seed(4);
  auto init = torch::randn({3, 5}, at::kDouble);
  auto ours = init.clone().requires_grad_(true), theirs = init.clone().requires_grad_(true);
  const auto options = torch::optim::AdamWOptions(1e-2).weight_decay(0.1);
  FusedAdamW fused({ours}, options);
  torch::optim::AdamW reference({theirs}, options);
  for (int step = 0; step < 5; ++step) {
    const auto g = torch::randn({3, 5}, at::kDouble);
    ours.mutable_grad() = g.clone();
    theirs.mutable_grad() = g.clone();
    fused.step();
    reference.step();
  }
  EXPECT_TRUE(torch::equal(ours, theirs));
}

TEST(FusedAdamWTest, TwoThreadsGiveTheSameBitsAsOne) {
  torch::manual_seed(9);
  const int64_t n = 200'003;  // several grains, split unevenly
  auto p1 = torch::randn({n}), g = torch::randn({n}), m1 = torch::zeros({n}),
       v1 = torch::zeros({n});
  auto p2 = p1.clone(), m2 = m1.clone(), v2 = v1.clone();
  const auto hyper = AdamWStep().step(1);
  fused_adamw_step(p1, g, m1, v1, hyper);
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  fused_adamw_step(p2, g, m2, v2, hyper);
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(p1, p2));
  EXPECT_TRUE(torch::equal(v1, v2));
}

TEST(FusedAdamWTest, BadInputNamesTheTensorAndTheMismatch) {
  auto p = torch::zeros({6}), g = torch::zeros({6}), m = torch::zeros({6}), v = torch::zeros({6});
  auto expect_error = [](const std::function<void()>& call, const std::string& text) {
    try {
      call();
      ADD_FAILURE() << "no error; expected: " << text;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  auto short_m = torch::zeros({5});
  expect_error([&] { fused_adamw_step(p, g, short_m, v, AdamWStep()); },
               "exp_avg has 5 elements, param has 6");
  const auto double_g = torch::zeros({6}, at::kDouble);
  expect_error([&] { fused_adamw_step(p, double_g, m, v, AdamWStep()); }, "grad is Double");
  auto strided_v = torch::zeros({12}).slice(0, 0, 12, 2);
  expect_error([&] { fused_adamw_step(p, g, m, strided_v, AdamWStep()); },
               "exp_avg_sq is not contiguous");
  expect_error([&] { fused_adamw_step(p, g, m, v, AdamWStep().step(0)); }, "step is 0");
  auto wrong_out = torch::zeros({6});
  expect_error([&] { fused_adamw_step(p, g, m, v, AdamWStep(), &wrong_out); }, "param_bf16_out");
  expect_error([&] { FusedAdamW({p}, torch::optim::AdamWOptions().amsgrad(true)); },
               "amsgrad is not supported");
}

}  // namespace fused_adamw_test
}  // namespace shardtrain
