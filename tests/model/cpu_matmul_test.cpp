// bf16 matrix products on the CPU (shardtrain::use_fp32_gemm_for_cpu_bf16, which the test main
// calls as the CLI does): each of mm, bmm, addmm and baddbmm returns bf16 within one bf16
// rounding of the exact product of its bf16 operands, over 4,096-term sums of positive values
// that a bf16 accumulator would get wrong by far more; transposed operands, a broadcast bias and
// alpha/beta included. Other dtypes get LibTorch's own kernels, bit for bit. Autocast's linear
// layer, forward and backward, matches fp32 within bf16's precision. SHARDTRAIN_CPU_BF16_GEMM
// takes "shardtrain" or "libtorch"; another value is refused.
#include <ATen/ATen.h>
#include <ATen/CPUFunctions.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>

#include "model/autocast.h"
#include "shardtrain/threads.h"
#include "support.h"

namespace shardtrain {
namespace cpu_matmul_test {

constexpr int64_t kTerms = 4096;

// Positive operands: the sums grow to ~1000, where bf16 holds 8 significant bits, so adding
// terms of ~0.25 to a bf16 running sum would lose most of them.
at::Tensor operand(std::vector<int64_t> shape, uint64_t seed) {
  at::manual_seed(seed);
  return at::rand(shape, at::kFloat).to(at::kBFloat16);
}

// Within one bf16 rounding (relative 2^-8, with a floor for values near 0) of `exact`.
void expect_one_rounding(const at::Tensor& got, const at::Tensor& exact) {
  ASSERT_EQ(got.scalar_type(), at::kBFloat16);
  ASSERT_EQ(got.sizes(), exact.sizes());
  const at::Tensor error = (got.to(at::kDouble) - exact).abs();
  const at::Tensor bound = exact.abs() * (1.0 / 256) + 1e-6;
  EXPECT_TRUE(error.le(bound).all().item<bool>())
      << "largest error " << error.max().item<double>() << " where the bound is "
      << bound.max().item<double>();
}

at::Tensor f64(const at::Tensor& t) { return t.to(at::kDouble); }

TEST(CpuBf16Matmul, EachProductIsTheExactOneRoundedOnce) {
  const at::Tensor a = operand({8, kTerms}, 1);
  const at::Tensor b = operand({kTerms, 6}, 2);
  expect_one_rounding(at::mm(a, b), at::mm(f64(a), f64(b)));
  const at::Tensor bt = operand({6, kTerms}, 3).t();  // a transposed, non-contiguous operand
  expect_one_rounding(at::mm(a, bt), at::mm(f64(a), f64(bt)));

  const at::Tensor bias = operand({6}, 4);
  expect_one_rounding(at::addmm(bias, a, b, 0.5, 2.0),
                      at::addmm(f64(bias), f64(a), f64(b), 0.5, 2.0));

  const at::Tensor x = operand({3, 5, kTerms}, 5);
  const at::Tensor y = operand({3, kTerms, 4}, 6);
  expect_one_rounding(at::bmm(x, y), at::bmm(f64(x), f64(y)));
  const at::Tensor c = operand({3, 5, 4}, 7);
  expect_one_rounding(at::baddbmm(c, x, y, 0.25, 1.5),
                      at::baddbmm(f64(c), f64(x), f64(y), 0.25, 1.5));

  // matmul and linear reach the same kernels.
  expect_one_rounding(at::matmul(x, b), at::matmul(f64(x), f64(b)));
  expect_one_rounding(at::linear(a, bt.t(), bias), at::linear(f64(a), f64(bt.t()), f64(bias)));
}

TEST(CpuBf16Matmul, OtherDtypesGetLibTorchsKernels) {
  at::manual_seed(8);
  for (const at::ScalarType dtype : {at::kFloat, at::kDouble, at::kLong}) {
    at::Tensor a = at::randint(-9, 9, {7, 33}).to(dtype);
    if (dtype != at::kLong) a += 0.5;
    const at::Tensor b = at::randint(-9, 9, {33, 5}).to(dtype);
    EXPECT_TRUE(at::equal(at::mm(a, b), at::cpu::mm(a, b))) << dtype;
    const at::Tensor x = a.unsqueeze(0).repeat({2, 1, 1});
    const at::Tensor y = b.unsqueeze(0).repeat({2, 1, 1});
    EXPECT_TRUE(at::equal(at::bmm(x, y), at::cpu::bmm(x, y))) << dtype;
  }
  const at::Tensor a = at::randn({4, 16});
  const at::Tensor b = at::randn({16, 3});
  const at::Tensor bias = at::randn({3});
  EXPECT_TRUE(at::equal(at::addmm(bias, a, b, 0.5, 2.0), at::cpu::addmm(bias, a, b, 0.5, 2.0)));
}

TEST(CpuBf16Matmul, AutocastLinearForwardAndBackwardMatchFp32) {
  at::manual_seed(9);
  const at::Tensor x0 = at::randn({32, 256});
  const at::Tensor w0 = at::randn({64, 256}) * 0.0625;
  auto run = [&](bool autocast) {
    const at::Tensor x = x0.clone().requires_grad_(true);
    const at::Tensor w = w0.clone().requires_grad_(true);
    at::Tensor y;
    {
      const detail::AutocastScope scope(detail::bf16_autocast(autocast));
      y = at::linear(x, w);
    }
    EXPECT_EQ(y.scalar_type(), autocast ? at::kBFloat16 : at::kFloat);
    (y.to(at::kFloat) * at::linspace(-1, 1, 64)).sum().backward();
    return std::vector<at::Tensor>{y.to(at::kFloat), x.grad(), w.grad()};
  };
  const auto low = run(true);
  const auto full = run(false);
  for (size_t i = 0; i < low.size(); ++i) {
    const double scale = full[i].abs().max().item<double>();
    EXPECT_LT((low[i] - full[i]).abs().max().item<double>(), 0.02 * scale) << "tensor " << i;
  }
}

TEST(CpuBf16Matmul, TheEnvironmentChoosesTheKernelsOrIsRefused) {
  auto with = [](const std::string& value) {
    return testing::run_command("SHARDTRAIN_CPU_BF16_GEMM=" + value + " " + testing::cli() +
                                " --version");
  };
  for (const char* good : {"shardtrain", "libtorch"}) EXPECT_EQ(with(good).exit_code, 0) << good;
  const auto bad = with("fast");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("shardtrain: error: SHARDTRAIN_CPU_BF16_GEMM must be \"shardtrain\" "
                            "(the default) or \"libtorch\", got \"fast\""),
            std::string::npos)
      << bad.output;
}

}  // namespace cpu_matmul_test
}  // namespace shardtrain
