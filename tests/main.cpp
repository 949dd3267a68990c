#include <ATen/Parallel.h>
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  // Multi-rank tests run several ranks on a couple of cores: one intra-op thread each.
  at::set_num_threads(1);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
