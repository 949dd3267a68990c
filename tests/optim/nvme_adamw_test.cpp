#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>

#include "shardtrain/fused_adamw.h"
#include "support.h"

namespace shardtrain {
namespace nvme_adamw_test {

namespace fs = std::filesystem;

// Several steps of NvmeAdamW against the in-memory fused kernel, from the same start; the
// chunk size does not divide numel, so the last chunk is short.
void expect_same_as_in_memory(const NvmeAdamWOptions& options) {
  torch::manual_seed(11);
  const int64_t n = 10'007;
  auto p_mem = torch::randn({n}), m = torch::zeros({n}), v = torch::zeros({n});
  auto p_file = p_mem.clone();
  NvmeAdamW swapped(n, options);
  auto bf16 = at::empty({n}, at::kBFloat16);
  for (int step = 1; step <= 4; ++step) {
    const auto g = torch::randn({n});
    const auto hyper = AdamWStep().lr(1e-2).weight_decay(0.1).step(step);
    fused_adamw_step(p_mem, g, m, v, hyper);
    swapped.step(p_file, g, hyper, &bf16);
    ASSERT_TRUE(torch::equal(p_file, p_mem)) << "step " << step;
  }
  EXPECT_TRUE(torch::equal(swapped.exp_avg(), m));
  EXPECT_TRUE(torch::equal(swapped.exp_avg_sq(), v));
  EXPECT_TRUE(torch::equal(bf16, p_mem.to(at::kBFloat16)));
}

TEST(NvmeAdamWTest, StepsEqualInMemoryStepsBitForBit) {
  const auto dir = testing::fresh_test_dir("nvme_adamw");
  expect_same_as_in_memory(NvmeAdamWOptions().dir(dir.string()).chunk_elements(1000));
  // One chunk larger than the partition, and chunks of one vector.
  expect_same_as_in_memory(NvmeAdamWOptions().dir(dir.string()).chunk_elements(1 << 20));
  expect_same_as_in_memory(NvmeAdamWOptions().dir(dir.string()).chunk_elements(16));
  EXPECT_TRUE(fs::is_empty(dir)) << "state files left behind";
  fs::remove_all(dir);
}

TEST(NvmeAdamWTest, DirectIoStepsEqualInMemorySteps) {
  const auto dir = testing::fresh_test_dir("nvme_adamw");
  try {
    NvmeAdamW probe(10, NvmeAdamWOptions().dir(dir.string()).direct_io(true));
  } catch (const std::invalid_argument& e) {
    fs::remove_all(dir);
    GTEST_SKIP() << "no O_DIRECT in " << dir << ": " << e.what();
  }
  // 3000 elements rounds up to 3072 (4 KiB blocks), still not a divisor of numel.
  expect_same_as_in_memory(
      NvmeAdamWOptions().dir(dir.string()).chunk_elements(3000).direct_io(true));
  fs::remove_all(dir);
}

TEST(NvmeAdamWTest, LoadedStateContinuesLikeInMemoryState) {
  const auto dir = testing::fresh_test_dir("nvme_adamw");
  torch::manual_seed(13);
  const int64_t n = 2'501;
  auto p_mem = torch::randn({n}), m = torch::randn({n}) * 0.1, v = torch::rand({n}) * 0.01;
  auto p_file = p_mem.clone();
  NvmeAdamW swapped(n, NvmeAdamWOptions().dir(dir.string()).chunk_elements(700));
  swapped.load(m, v);
  EXPECT_TRUE(torch::equal(swapped.exp_avg(), m));
  const auto g = torch::randn({n});
  const auto hyper = AdamWStep().step(8);
  fused_adamw_step(p_mem, g, m, v, hyper);
  swapped.step(p_file, g, hyper);
  EXPECT_TRUE(torch::equal(p_file, p_mem));
  EXPECT_TRUE(torch::equal(swapped.exp_avg_sq(), v));
  fs::remove_all(dir);
}

TEST(NvmeAdamWTest, SwappedParametersEqualInMemorySteps) {
  const auto dir = testing::fresh_test_dir("nvme_adamw");
  torch::manual_seed(17);
  const int64_t n = 4'099;
  auto p_mem = torch::randn({n}), m = torch::zeros({n}), v = torch::zeros({n});
  NvmeAdamW swapped(n, NvmeAdamWOptions().dir(dir.string()).chunk_elements(1000).swap_params(true));
  swapped.load_param(p_mem);
  auto bf16 = at::empty({n}, at::kBFloat16);
  for (int step = 1; step <= 3; ++step) {
    const auto g = torch::randn({n});
    const auto hyper = AdamWStep().lr(1e-2).weight_decay(0.1).step(step);
    fused_adamw_step(p_mem, g, m, v, hyper);
    swapped.step(g, hyper, &bf16);
  }
  EXPECT_TRUE(torch::equal(swapped.param(), p_mem));
  EXPECT_TRUE(torch::equal(bf16, p_mem.to(at::kBFloat16)));
  EXPECT_TRUE(torch::equal(swapped.exp_avg_sq(), v));
  // The two step() forms belong to the two modes; using the other one is an error.
  auto p = torch::zeros({n});
  EXPECT_THROW(swapped.step(p, torch::zeros({n}), AdamWStep()), std::invalid_argument);
  NvmeAdamW in_memory_params(n, NvmeAdamWOptions().dir(dir.string()));
  EXPECT_THROW(in_memory_params.step(torch::zeros({n}), AdamWStep()), std::invalid_argument);
  EXPECT_THROW(in_memory_params.param(), std::invalid_argument);
  fs::remove_all(dir);
}

TEST(NvmeAdamWTest, MissingOrUnwritableDirectoryIsNamed) {
  const auto dir = testing::fresh_test_dir("nvme_adamw");
  const std::string missing = (dir / "absent").string();
  try {
    NvmeAdamW swapped(10, NvmeAdamWOptions().dir(missing));
    ADD_FAILURE() << "no error for " << missing;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  // Root writes anywhere: the permission case only means something for other users.
  if (geteuid() != 0) {
    const auto locked = dir / "locked";
    fs::create_directory(locked);
    chmod(locked.c_str(), 0500);
    try {
      NvmeAdamW swapped(10, NvmeAdamWOptions().dir(locked.string()));
      ADD_FAILURE() << "no error for " << locked;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(locked.string()), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("Permission denied"), std::string::npos) << e.what();
    }
    chmod(locked.c_str(), 0700);
  }
  fs::remove_all(dir);
}

TEST(NvmeAdamWTest, TruncatedStateFileFailsTheStepNamingIt) {
  const auto dir = testing::fresh_test_dir("nvme_adamw");
  const int64_t n = 5'000;
  auto p = torch::randn({n}), g = torch::randn({n});
  NvmeAdamW swapped(n, NvmeAdamWOptions().dir(dir.string()).chunk_elements(1024));
  ASSERT_EQ(truncate(swapped.exp_avg_sq_path().c_str(), 100), 0);
  try {
    swapped.step(p, g, AdamWStep());
    ADD_FAILURE() << "no error for a truncated file";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(swapped.exp_avg_sq_path()), std::string::npos) << e.what();
  }
  auto short_p = torch::zeros({n - 1});
  EXPECT_THROW(swapped.step(short_p, torch::zeros({n - 1}), AdamWStep()), std::invalid_argument);
  fs::remove_all(dir);
}

}  // namespace nvme_adamw_test
}  // namespace shardtrain
