#include "shardtrain/mesh.h"

#include <gtest/gtest.h>

#include "shardtrain/rendezvous.h"

namespace shardtrain {
namespace mesh_test {

std::string mesh_error(MeshShape shape, int world) {
  try {
    resolve_mesh(shape, world);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(MeshTest, MinusOneTakesTheRanksLeftOver) {
  const auto shape = resolve_mesh(MeshShape().tp(2).pp(2).dp_shard(-1), 16);
  EXPECT_EQ(shape.degree(MeshAxis::kDpShard), 4);
  EXPECT_EQ(resolve_mesh(MeshShape(), 6).degree(MeshAxis::kDpShard), 6);
}

TEST(MeshTest, MismatchNamesEveryFactor) {
  const std::string e = mesh_error(MeshShape().dp_shard(3).tp(2), 4);
  EXPECT_NE(e.find("pp=1 x dp_replicate=1 x dp_shard=3 x tp=2 = 6 does not match world size 4"),
            std::string::npos)
      << e;
  const std::string indivisible = mesh_error(MeshShape().tp(4), 6);
  EXPECT_NE(indivisible.find("world size 6 is not divisible by 4"), std::string::npos)
      << indivisible;
  EXPECT_NE(mesh_error(MeshShape().tp(-1), 4).find("only one axis may be -1"), std::string::npos);
  EXPECT_NE(mesh_error(MeshShape().pp(0), 4).find("pp must be at least 1"), std::string::npos);
}

TEST(MeshTest, SubgroupsOfATwoByTwoMesh) {
  // dp_replicate=2 x dp_shard=2: shard groups {0,1},{2,3}; replicate groups {0,2},{1,3}.
  run_local_ranks(
      4,
      [](ProcessGroup& world) {
        DeviceMesh mesh(std::shared_ptr<ProcessGroup>(&world, [](ProcessGroup*) {}),
                        MeshShape().dp_replicate(2).dp_shard(2));
        const int r = world.rank();
        EXPECT_EQ(mesh.coordinate(MeshAxis::kDpReplicate), r / 2);
        EXPECT_EQ(mesh.coordinate(MeshAxis::kDpShard), r % 2);
        auto& shard = mesh.group(MeshAxis::kDpShard);
        auto& replicate = mesh.group(MeshAxis::kDpReplicate);
        EXPECT_EQ(shard.size(), 2);
        EXPECT_EQ(shard.global_ranks(), (std::vector<int>{r / 2 * 2, r / 2 * 2 + 1}));
        EXPECT_EQ(replicate.global_ranks(), (std::vector<int>{r % 2, r % 2 + 2}));
        EXPECT_EQ(mesh.group(MeshAxis::kTp).size(), 1);
        EXPECT_EQ(mesh.dp().size(), 4);

        // Sums over each axis only see that axis's members.
        at::Tensor a = at::full({5}, static_cast<float>(r));
        shard.all_reduce(a)->wait();
        EXPECT_EQ(a[0].item<float>(), (r / 2 * 2) * 2 + 1);
        at::Tensor b = at::full({5}, static_cast<float>(r));
        replicate.all_reduce(b)->wait();
        EXPECT_EQ(b[0].item<float>(), 2 * (r % 2) + 2);
        at::Tensor gathered = at::empty({4});
        shard.all_gather(at::full({2}, static_cast<float>(r)), gathered)->wait();
        EXPECT_EQ(gathered[3].item<float>(), r / 2 * 2 + 1);
      },
      ProcessGroupOptions().timeout(std::chrono::seconds(60)));
}

TEST(MeshTest, PipelineByTensorParallelLayout) {
  run_local_ranks(
      4,
      [](ProcessGroup& world) {
        DeviceMesh mesh(std::shared_ptr<ProcessGroup>(&world, [](ProcessGroup*) {}),
                        MeshShape().pp(2).tp(2).dp_shard(-1));
        const int r = world.rank();
        EXPECT_EQ(mesh.size(MeshAxis::kDpShard), 1);
        EXPECT_EQ(mesh.group(MeshAxis::kTp).global_ranks(),
                  (std::vector<int>{r / 2 * 2, r / 2 * 2 + 1}));
        EXPECT_EQ(mesh.group(MeshAxis::kPp).global_ranks(), (std::vector<int>{r % 2, r % 2 + 2}));
        // Stage-to-stage point-to-point inside the pp group.
        auto& pp = mesh.group(MeshAxis::kPp);
        at::Tensor activation = at::full({3}, 10.0f + r);
        if (pp.rank() == 0) {
          pp.send(activation, 1)->wait();
        } else {
          pp.recv(activation, 0)->wait();
          EXPECT_EQ(activation[0].item<float>(), 10.0f + r - 2);
        }
      },
      ProcessGroupOptions().timeout(std::chrono::seconds(60)));
}

}  // namespace mesh_test
}  // namespace shardtrain
