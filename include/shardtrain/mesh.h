// The device mesh pp x dp_replicate x dp_shard x cp x tp: one value, validated once, holding the
// group of each axis for this rank.
#pragma once

#include <array>
#include <memory>
#include <string>

#include "shardtrain/dist.h"

namespace shardtrain {

enum class MeshAxis { kPp = 0, kDpReplicate = 1, kDpShard = 2, kCp = 3, kTp = 4 };
constexpr int kMeshAxes = 5;
std::string to_string(MeshAxis axis);

// Degrees of the five axes. At most one may be -1: it takes the ranks left over. `ep` is not an
// axis of its own: expert parallelism splits the experts of mixture-of-experts layers over
// groups of `ep` neighbouring ranks of dp_shard x cp (torchtitan's dp_shard_in_ep), which must
// divide it.
struct MeshShape {
  MeshShape& pp(int value) {
    degrees[0] = value;
    return *this;
  }
  MeshShape& dp_replicate(int value) {
    degrees[1] = value;
    return *this;
  }
  MeshShape& dp_shard(int value) {
    degrees[2] = value;
    return *this;
  }
  MeshShape& cp(int value) {
    degrees[3] = value;
    return *this;
  }
  MeshShape& tp(int value) {
    degrees[4] = value;
    return *this;
  }
  MeshShape& ep(int value) {
    ep_degree = value;
    return *this;
  }
  int degree(MeshAxis axis) const { return degrees[static_cast<int>(axis)]; }

  std::array<int, kMeshAxes> degrees{1, 1, -1, 1, 1};  // pp, dp_replicate, dp_shard, cp, tp
  int ep_degree = 1;
};

// Fills in the -1 axis and checks that the product equals world_size, and that ep divides
// dp_shard x cp. Throws std::invalid_argument with every factor in the message, e.g.
// "mesh pp=1 x dp_replicate=1 x dp_shard=3 x tp=2 = 6 does not match world size 4" (cp and ep
// are named when they are not 1).
MeshShape resolve_mesh(MeshShape shape, int world_size);

// Ranks are laid out with tp innermost, then cp, dp_shard, dp_replicate, pp outermost:
// rank = (((pp * R + dp_replicate) * S + dp_shard) * C + cp) * T + tp, so tensor-parallel peers
// are neighbours (same node first), context-parallel peers next, and pipeline stages are
// furthest apart.
class DeviceMesh {
 public:
  // Collective over `world`: every rank calls it with the same shape. Creates this rank's
  // group on each axis, and the combined data-parallel group (dp_replicate x dp_shard).
  DeviceMesh(std::shared_ptr<ProcessGroup> world, MeshShape shape);
  ~DeviceMesh();

  const MeshShape& shape() const { return shape_; }
  int size(MeshAxis axis) const { return shape_.degree(axis); }
  // This rank's index along `axis`.
  int coordinate(MeshAxis axis) const { return coordinate_[static_cast<int>(axis)]; }
  ProcessGroup& group(MeshAxis axis) const { return *groups_[static_cast<int>(axis)]; }
  std::shared_ptr<ProcessGroup> group_ptr(MeshAxis axis) const {
    return groups_[static_cast<int>(axis)];
  }
  // dp_replicate x dp_shard: the ranks that see different data.
  ProcessGroup& dp() const { return *dp_; }
  std::shared_ptr<ProcessGroup> dp_ptr() const { return dp_; }
  ProcessGroup& world() const { return *world_; }
  // The mesh the data-parallel strategies run on: this one with cp folded into dp_shard
  // (dp_shard x cp ranks, in the same places), since context-parallel ranks hold the same
  // parameters and their gradients, each from part of the sequences, are summed as data
  // parallelism's are (torchtitan's dp_shard_cp). This mesh itself when cp = 1.
  const DeviceMesh& data_parallel_mesh() const { return folded_ ? *folded_ : *this; }
  // Global rank at the given coordinates (pp, dp_replicate, dp_shard, cp, tp).
  int rank_at(const std::array<int, kMeshAxes>& coordinates) const;

  // Expert parallelism (shape().ep_degree > 1), on the data-parallel layout (dp_shard x cp):
  // the ep group is this rank and its ep - 1 neighbours there, which hold the other experts;
  // ep_rank() is this rank's place in it (it holds experts [ep_rank() x n / ep, ...)). The
  // expert mesh is the mesh the experts' data-parallel step runs on: the ranks that hold the same
  // experts, with dp_shard x cp / ep of them on its dp_shard axis (torchtitan's
  // dp_shard_mod_ep); its other axes as this mesh's. With ep = 1: no group (ep_ptr() null),
  // ep_rank() 0, and the expert mesh is data_parallel_mesh().
  int ep_size() const { return shape_.ep_degree; }
  int ep_rank() const { return ep_ ? ep_->rank() : 0; }
  std::shared_ptr<ProcessGroup> ep_ptr() const { return ep_; }
  const DeviceMesh& expert_mesh() const;

 private:
  std::shared_ptr<ProcessGroup> world_;
  MeshShape shape_;
  std::array<int, kMeshAxes> coordinate_{};
  std::array<std::shared_ptr<ProcessGroup>, kMeshAxes> groups_;
  std::shared_ptr<ProcessGroup> dp_;
  std::unique_ptr<DeviceMesh> folded_;  // cp > 1 only
  std::shared_ptr<ProcessGroup> ep_;
  std::unique_ptr<DeviceMesh> expert_;  // ep > 1 and cp = 1 only (else folded_'s)

  void split_experts();
};

}  // namespace shardtrain
