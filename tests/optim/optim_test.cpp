#include "shardtrain/optim.h"

#include <gtest/gtest.h>

#include <cmath>

namespace shardtrain {
namespace optim_test {

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

TEST(OptimTest, LogWarmupIsDeepSpeedsShape) {
  LrSchedule s{2.0, 0.0, 10, 100, "constant"};
  s.warmup_type = "log";
  EXPECT_DOUBLE_EQ(s.at(0), 0.0);  // ln 1
  EXPECT_NEAR(s.at(4), 2.0 * std::log(5.0) / std::log(10.0), 1e-15);
  EXPECT_NEAR(s.at(9), 2.0, 1e-15);  // ln 10 / ln 10
  EXPECT_DOUBLE_EQ(s.at(10), 2.0);
  s.warmup = 1;
  EXPECT_DOUBLE_EQ(s.at(0), 2.0);
}

TEST(OptimTest, HysteresisLowersTheScaleAtTheHthOverflow) {
  // DeepSpeed's hysteresis 2: the first overflow only uses up the count, the second halves the
  // scale, and so does every later one until a growth refills it.
  LossScaler scaler(LossScaler::Mode::kDynamic, 1024.0, 2, 1.0);
  scaler.set_hysteresis(2, false);
  EXPECT_FALSE(scaler.update(false));
  EXPECT_DOUBLE_EQ(scaler.scale(), 1024.0);
  EXPECT_TRUE(scaler.update(true));  // a good step does not refill without `consecutive`
  EXPECT_FALSE(scaler.update(false));
  EXPECT_DOUBLE_EQ(scaler.scale(), 512.0);
  EXPECT_FALSE(scaler.update(false));
  EXPECT_DOUBLE_EQ(scaler.scale(), 256.0);
  EXPECT_TRUE(scaler.update(true));
  EXPECT_TRUE(scaler.update(true));  // grows, and refills
  EXPECT_DOUBLE_EQ(scaler.scale(), 512.0);
  EXPECT_EQ(scaler.hysteresis_left(), 2);
  EXPECT_FALSE(scaler.update(false));
  EXPECT_DOUBLE_EQ(scaler.scale(), 512.0);
  EXPECT_EQ(scaler.skipped_steps(), 4);

  LossScaler consecutive(LossScaler::Mode::kDynamic, 1024.0, 100, 1.0);
  consecutive.set_hysteresis(2, true);
  consecutive.update(false);
  consecutive.update(true);  // refills
  consecutive.update(false);
  EXPECT_DOUBLE_EQ(consecutive.scale(), 1024.0);
  consecutive.update(false);
  EXPECT_DOUBLE_EQ(consecutive.scale(), 512.0);
  // A checkpoint's count is restored; one without it refills.
  LossScaler restored(LossScaler::Mode::kDynamic, 1024.0, 100, 1.0);
  restored.set_hysteresis(3, false);
  restored.restore(64.0, 5, 1, 1);
  restored.update(false);
  EXPECT_DOUBLE_EQ(restored.scale(), 32.0);
  restored.restore(64.0, 5, 1);
  EXPECT_EQ(restored.hysteresis_left(), 3);
  EXPECT_THROW(restored.set_hysteresis(0, false), std::invalid_argument);
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

}  // namespace optim_test
}  // namespace shardtrain
