// run.device = "cuda": refused with one clear message where no GPU is visible; where one is,
// the tiny model's losses on it equal the CPU run's, bf16 autocast trains, and a checkpoint
// saved from the GPU resumes on the CPU. The GPU tests skip on a machine without one.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cmath>
#include <filesystem>

#include "shardtrain/train.h"
#include "support.h"
#include "train/run_config.h"

namespace shardtrain {
namespace cuda_trainer_test {

namespace fs = std::filesystem;

class CudaTrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::fresh_test_dir("shardtrain_cuda_trainer");
    testing::write_trainer_corpus(dir_ / "corpus.txt");
  }
  void TearDown() override { fs::remove_all(dir_); }

  TrainConfig config(const std::string& run, const std::vector<std::string>& overrides) const {
    // No dropout: the CPU's and the GPU's random streams differ.
    std::vector<std::string> all = {"train.micro_batch=4", "train.steps=6", "model.dropout=0"};
    all.insert(all.end(), overrides.begin(), overrides.end());
    return testing::tiny_run_config(dir_ / "corpus.txt", dir_ / run, all);
  }

  fs::path dir_;
};

TEST_F(CudaTrainerTest, WithoutAGpuTheRunIsRefusedBeforeItsDirectoryIsMade) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a CUDA device is visible";
  try {
    Trainer trainer(config("run", {"run.device=\"cuda\""}));
    FAIL() << "a CUDA run started without a CUDA device";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("run.device = \"cuda\""), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir_ / "run"));
}

TEST_F(CudaTrainerTest, Fp32LossesAndParametersOnTheGpuEqualTheCpuRuns) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Trainer cpu(config("cpu", {}));
  Trainer gpu(config("gpu", {"run.device=\"cuda\""}));
  ASSERT_TRUE(gpu.model()->parameters()[0].is_cuda());
  const auto want = testing::step_losses(cpu, 6);
  const auto got = testing::step_losses(gpu, 6);
  // Other kernels (cuBLAS, the fused attention) sum in other orders: equal to float rounding.
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-4 * std::abs(want[i])) << "step " << i + 1;
  }
  const auto a = cpu.model()->parameters();
  const auto b = gpu.model()->parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(at::allclose(b[i].cpu(), a[i], 1e-3, 1e-5)) << "parameter " << i;
  }
}

TEST_F(CudaTrainerTest, Bf16AutocastOnTheGpuFollowsTheFp32Run) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Trainer fp32(config("fp32", {"run.device=\"cuda\""}));
  Trainer bf16(config("bf16", {"run.device=\"cuda\"", "precision.autocast=\"bf16\""}));
  const auto want = testing::step_losses(fp32, 6);
  const auto got = testing::step_losses(bf16, 6);
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << "step " << i + 1;
    EXPECT_NEAR(got[i], want[i], 2e-2 * std::abs(want[i])) << "step " << i + 1;
  }
  EXPECT_LT(got.back(), got.front());
}

TEST_F(CudaTrainerTest, ACheckpointSavedOnTheGpuResumesOnTheCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  // Three steps of the six-step run, saved, then its steps 4 to 6: the schedule is the same.
  Trainer gpu(config("gpu", {"run.device=\"cuda\""}));
  testing::step_losses(gpu, 3);
  const std::string saved = gpu.save_checkpoint();
  const auto want = testing::step_losses(gpu, 3);  // steps 4 to 6 on the GPU

  TrainConfig resumed = config("cpu", {});
  resumed.run.resume = saved;
  Trainer cpu(resumed);
  ASSERT_EQ(cpu.step(), 3);
  const auto got = testing::step_losses(cpu, 3);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-4 * std::abs(want[i])) << "step " << i + 4;
  }
}

TEST_F(CudaTrainerTest, WithDropoutAResumedGpuRunDrawsTheUninterruptedRunsMasks) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const std::vector<std::string> keys = {"run.device=\"cuda\"", "model.dropout=0.1"};
  Trainer uninterrupted(config("all", keys));
  const auto want = testing::step_losses(uninterrupted, 6);

  Trainer half(config("half", keys));
  testing::step_losses(half, 3);
  TrainConfig resumed = config("resumed", keys);
  resumed.run.resume = half.save_checkpoint();
  Trainer second(resumed);
  const auto got = testing::step_losses(second, 3);
  // The GPU's own random stream is restored with the CPU's; some CUDA kernels (attention's
  // backward) sum in a varying order, so equal to float rounding rather than bit for bit.
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i + 3], 1e-5 * std::abs(want[i + 3])) << "step " << i + 4;
  }
}

}  // namespace cuda_trainer_test
}  // namespace shardtrain
