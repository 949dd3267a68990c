#include "shardtrain/optim.h"

#include <gtest/gtest.h>

#include <cmath>

namespace shardtrain {
namespace {

TEST(OptimTest, WarmupThenCosineToTheFloor) {
  const LrSchedule s{1.0, 0.1, 10, 110, "cosine"};
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);  // halfway: midpoint of lr and min_lr
  EXPECT_NEAR(s.at(110), 0.1, 1e-12);
  EXPECT_NEAR(s.at(500), 0.1, 1e-12);
  EXPECT_DOUBLE_EQ((LrSchedule{1.0, 0.0, 0, 100, "constant"}).at(50), 1.0);
  EXPECT_DOUBLE_EQ((LrSchedule{1.0, 0.0, 0, 100, "linear"}).at(50), 0.5);
}

TEST(OptimTest, ClippingScalesToTheMaximumNorm) {
  at::Tensor a = at::zeros({2}, at::requires_grad()), b = at::zeros({1}, at::requires_grad());
  a.mutable_grad() = at::tensor({3.0f, 0.0f});
  b.mutable_grad() = at::tensor({4.0f});
  EXPECT_NEAR(clip_grad_norm({a, b}, 1.0), 5.0, 1e-9);
  EXPECT_NEAR(clip_grad_norm({a, b}, 0.0), 1.0, 1e-5);  // measured after the clip
  EXPECT_NEAR(a.grad()[0].item<float>(), 0.6f, 1e-5);
}

TEST(OptimTest, DynamicLossScaleBacksOffOnOverflowAndGrowsAfterAWindow) {
  LossScaler scaler(LossScaler::Mode::kDynamic, 1024.0, 3, 1.0);
  at::Tensor p = at::zeros({2}, at::requires_grad());
  p.mutable_grad() = at::tensor({2048.0f, INFINITY});
  EXPECT_FALSE(scaler.unscale({p}));
  EXPECT_FALSE(scaler.update(false));  // skip
  EXPECT_DOUBLE_EQ(scaler.scale(), 512.0);
  p.mutable_grad() = at::tensor({512.0f, 1024.0f});
  EXPECT_TRUE(scaler.unscale({p}));
  EXPECT_FLOAT_EQ(p.grad()[1].item<float>(), 2.0f);
  EXPECT_TRUE(scaler.update(true));
  EXPECT_TRUE(scaler.update(true));
  EXPECT_DOUBLE_EQ(scaler.scale(), 512.0);
  EXPECT_TRUE(scaler.update(true));  // third good step in a row: grow
  EXPECT_DOUBLE_EQ(scaler.scale(), 1024.0);
  EXPECT_EQ(scaler.skipped_steps(), 1);

  LossScaler floor(LossScaler::Mode::kDynamic, 2.0, 10, 1.0);
  floor.update(false);
  floor.update(false);
  EXPECT_DOUBLE_EQ(floor.scale(), 1.0);
  EXPECT_DOUBLE_EQ(LossScaler::from_config("none", 5, 1, 1).scale(), 1.0);
  EXPECT_DOUBLE_EQ(LossScaler::from_config("128", 5, 1, 1).scale(), 128.0);
}

}  // namespace
}  // namespace shardtrain
