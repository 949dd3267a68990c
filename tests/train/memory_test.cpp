#include "shardtrain/memory.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <fstream>
#include <string>
#include <vector>

namespace shardtrain {
namespace memory_test {

// This process's resident bytes, from the kernel (/proc/self/status).
int64_t resident_bytes() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return 0;
}

int64_t minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

constexpr int64_t kMiB = int64_t{1} << 20;

// Tensors of `bytes` each, written so that every page is resident.
std::vector<at::Tensor> touched(int count, int64_t bytes) {
  std::vector<at::Tensor> tensors;
  for (int i = 0; i < count; ++i) tensors.push_back(at::ones({bytes / 4}, at::kFloat));
  return tensors;
}

TEST(MemoryTest, CountsLiveAndPeakTensorBytesExactly) {
  install_cpu_memory_tracking();
  install_cpu_memory_tracking();  // a second call changes nothing
  const int64_t base = cpu_memory_stats().live_bytes;
  reset_peak_cpu_memory();
  {
    at::Tensor a = at::empty({1000}, at::kFloat);  // 4000 bytes
    EXPECT_EQ(cpu_memory_stats().live_bytes - base, 4000);
    {
      at::Tensor b = at::empty({250}, at::kDouble);  // 2000 bytes
      EXPECT_EQ(cpu_memory_stats().live_bytes - base, 6000);
    }
    EXPECT_EQ(cpu_memory_stats().live_bytes - base, 4000);
    EXPECT_EQ(cpu_memory_stats().peak_bytes - base, 6000);
  }
  EXPECT_EQ(cpu_memory_stats().live_bytes, base);
  reset_peak_cpu_memory();
  EXPECT_EQ(cpu_memory_stats().peak_bytes, base);
  // Tensors still compute normally through the wrapper.
  EXPECT_EQ(at::ones({3}).sum().item<float>(), 3.0f);
}

TEST(MemoryTest, AFreedLargeBlockServesTheNextTensorOfItsSize) {
  install_cpu_memory_tracking();
  void* first = nullptr;
  {
    at::Tensor a = at::empty({large_cpu_block_bytes()}, at::kFloat);
    first = a.data_ptr();
  }
  const int64_t cached = cpu_memory_stats().cached_bytes;
  EXPECT_GE(cached, 4 * large_cpu_block_bytes());
  at::Tensor b = at::empty({large_cpu_block_bytes()}, at::kFloat);
  EXPECT_EQ(b.data_ptr(), first);
  EXPECT_EQ(cpu_memory_stats().cached_bytes, cached - 4 * large_cpu_block_bytes());
  // Small blocks stay with LibTorch's own allocator and are counted all the same.
  const int64_t live = cpu_memory_stats().live_bytes;
  at::Tensor small = at::empty({100}, at::kFloat);
  EXPECT_EQ(cpu_memory_stats().live_bytes - live, 400);
}

TEST(MemoryTest, ResidentMemoryFollowsTheLiveBytesWhenSizesChange) {
  install_cpu_memory_tracking();
  // Rounds of 64 MiB live in one size, then another, as forward's and backward's tensors do:
  // what stays resident is the most live at once, however often the sizes alternate. (A cache
  // of every size, or a heap holding every arrangement, would keep 64 MiB per size.)
  if (cpu_memory_stats().cache_limit_bytes > 64 * kMiB) {
    GTEST_SKIP() << "earlier tests in this process raised the cache's bound; run it alone";
  }
  const int64_t before = resident_bytes();
  int64_t highest = 0;
  int64_t faults_after_first_round = 0;
  const int64_t sizes[] = {2 * kMiB, 4 * kMiB, 8 * kMiB, 3 * kMiB};
  for (int round = 0; round < 3; ++round) {
    if (round == 1) faults_after_first_round = minor_faults();
    for (int64_t size : sizes) {
      auto live = touched(static_cast<int>(64 * kMiB / size), size);
      highest = std::max(highest, resident_bytes() - before);
    }
  }
  // The later rounds' tensors are made of the first round's pages, not zero pages faulted in
  // again: 2 rounds x 4 sizes x 64 MiB would be 131,072 faults of 4 KiB pages.
  EXPECT_LT(minor_faults() - faults_after_first_round, 131072 / 32);
  EXPECT_GE(highest, 60 * kMiB);  // the tensors were resident
  EXPECT_LE(highest, 64 * kMiB + 8 * kMiB) << "resident bytes above the start";
  EXPECT_LE(cpu_memory_stats().cached_bytes, 64 * kMiB);
  EXPECT_LE(cpu_memory_stats().cache_limit_bytes, 64 * kMiB + 8 * kMiB);
}

TEST(MemoryTest, WithoutTheCacheFreedBlocksGoBackToTheKernel) {
  install_cpu_memory_tracking();
  set_freed_memory(FreedMemory::kReturn);
  EXPECT_EQ(cpu_memory_stats().cached_bytes, 0);
  int64_t held = 0;
  {
    auto live = touched(8, 8 * kMiB);
    held = resident_bytes();
  }
  const int64_t after = resident_bytes();
  set_freed_memory(FreedMemory::kCache);
  EXPECT_GE(held - after, 60 * kMiB) << "the 64 MiB freed stayed resident";
  EXPECT_EQ(cpu_memory_stats().cached_bytes, 0);
}

}  // namespace memory_test
}  // namespace shardtrain
