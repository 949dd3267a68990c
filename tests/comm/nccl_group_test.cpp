// The NCCL process group: refused by name where LibTorch has no CUDA; where it has and a GPU
// is visible, its collectives at world size 1 (one GPU holds one NCCL rank) on CUDA tensors.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "shardtrain/dist.h"

namespace shardtrain {
namespace nccl_group_test {

std::shared_ptr<ProcessGroup> nccl_world() {
  return init_process_group(c10::make_intrusive<c10d::HashStore>(), 0, 1,
                            ProcessGroupOptions().backend(Backend::kNccl));
}

#ifndef SHARDTRAIN_WITH_NCCL
TEST(NcclGroupTest, WithoutCudaTheBackendIsRefusedByName) {
  try {
    nccl_world();
    FAIL() << "an NCCL group was made by a build without CUDA";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("backend nccl is not available"), std::string::npos)
        << e.what();
  }
}
#else
TEST(NcclGroupTest, CollectivesAtWorldSizeOneOnTheGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto world = nccl_world();
  EXPECT_EQ(world->backend(), Backend::kNccl);
  const auto cuda = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat);
  const at::Tensor values = torch::arange(7, cuda);

  // At world size 1 an all_reduce or a broadcast in place leaves its tensor as it was whether
  // or not NCCL ran; the gather and the scatter write into zeros, so they show that it did.
  at::Tensor reduced = values.clone();
  world->all_reduce(reduced, ReduceOp::kSum)->wait();
  EXPECT_TRUE(torch::equal(reduced.cpu(), values.cpu()));

  at::Tensor gathered = torch::zeros({7}, cuda);
  world->all_gather(values, gathered)->wait();
  EXPECT_TRUE(torch::equal(gathered.cpu(), values.cpu()));

  at::Tensor scattered = torch::zeros({7}, cuda);
  world->reduce_scatter(values, scattered, ReduceOp::kSum)->wait();
  EXPECT_TRUE(torch::equal(scattered.cpu(), values.cpu()));

  at::Tensor broadcast = values.clone();
  world->broadcast(broadcast, 0)->wait();
  EXPECT_TRUE(torch::equal(broadcast.cpu(), values.cpu()));
  world->barrier()->wait();
}
#endif

}  // namespace nccl_group_test
}  // namespace shardtrain
