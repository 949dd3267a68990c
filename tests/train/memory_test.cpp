#include "shardtrain/memory.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace shardtrain {
namespace {

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

}  // namespace
}  // namespace shardtrain
