#include "shardtrain/threads.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <fstream>
#include <stdexcept>
#include <string>

namespace shardtrain {
namespace threads_test {

bool openblas_loaded() {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find("libopenblas") != std::string::npos) return true;
  }
  return false;
}

TEST(ThreadsTest, SetsLibTorchAndItsBlasTogether) {
  const int saved = at::get_num_threads();
  if (!openblas_loaded()) {
    EXPECT_EQ(blas_num_threads(), 0);
    GTEST_SKIP() << "LibTorch's BLAS here is not OpenBLAS: only at::set_num_threads applies";
  }
  for (int threads : {2, 1}) {
    set_num_threads(threads);
    EXPECT_EQ(at::get_num_threads(), threads);
    EXPECT_EQ(blas_num_threads(), threads);
  }
  set_num_threads(saved);
}

TEST(ThreadsTest, FewerThanOneThreadIsAnError) {
  const int saved = at::get_num_threads();
  try {
    set_num_threads(0);
    FAIL() << "set_num_threads(0) was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("threads must be >= 1, got 0"), std::string::npos);
  }
  EXPECT_EQ(at::get_num_threads(), saved);
}

}  // namespace threads_test
}  // namespace shardtrain
