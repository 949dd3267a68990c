#include <gtest/gtest.h>

#include "shardtrain/threads.h"

int main(int argc, char** argv) {
  // Multi-rank tests run several ranks on a couple of cores: one intra-op thread each,
  // in LibTorch and in its BLAS.
  shardtrain::set_num_threads(1);
  // bf16 products as the trainer and the CLI compute them, from the first test on.
  shardtrain::use_fp32_gemm_for_cpu_bf16();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
