#include "shardtrain/mesh.h"

#include <sstream>
#include <stdexcept>

namespace shardtrain {
namespace {

constexpr const char* kAxisNames[kMeshAxes] = {"pp", "dp_replicate", "dp_shard", "cp", "tp"};
constexpr int kCpAxis = static_cast<int>(MeshAxis::kCp);

std::string describe(const MeshShape& shape) {
  std::ostringstream out;
  for (int a = 0; a < kMeshAxes; ++a) {
    if (a == kCpAxis && shape.degrees[a] == 1) continue;
    out << (a ? " x " : "") << kAxisNames[a] << "=" << shape.degrees[a];
  }
  if (shape.ep_degree != 1) out << " (ep=" << shape.ep_degree << ")";
  return out.str();
}

}  // namespace

std::string to_string(MeshAxis axis) { return kAxisNames[static_cast<int>(axis)]; }

MeshShape resolve_mesh(MeshShape shape, int world_size) {
  int product = 1;
  int inferred = -1;
  for (int a = 0; a < kMeshAxes; ++a) {
    const int d = shape.degrees[a];
    if (d == -1) {
      if (inferred >= 0) {
        throw std::invalid_argument("mesh " + describe(shape) + ": only one axis may be -1");
      }
      inferred = a;
    } else if (d < 1) {
      throw std::invalid_argument("mesh " + describe(shape) + ": " + kAxisNames[a] +
                                  " must be at least 1 (or -1 for the ranks left over)");
    } else {
      product *= d;
    }
  }
  if (inferred >= 0) {
    if (world_size % product != 0) {
      throw std::invalid_argument("mesh " + describe(shape) + ": world size " +
                                  std::to_string(world_size) + " is not divisible by " +
                                  std::to_string(product) + ", the product of the other axes");
    }
    shape.degrees[inferred] = world_size / product;
    product = world_size;
  }
  if (product != world_size) {
    throw std::invalid_argument("mesh " + describe(shape) + " = " + std::to_string(product) +
                                " does not match world size " + std::to_string(world_size));
  }
  const int data_ranks = shape.degrees[2] * shape.degrees[kCpAxis];
  if (shape.ep_degree < 1 || data_ranks % shape.ep_degree != 0) {
    throw std::invalid_argument(
        "mesh " + describe(shape) + ": ep=" + std::to_string(shape.ep_degree) +
        " does not divide dp_shard" + (shape.degrees[kCpAxis] > 1 ? " x cp" : "") + " = " +
        std::to_string(data_ranks) + " (the experts are split over those data-parallel ranks)");
  }
  return shape;
}

DeviceMesh::DeviceMesh(std::shared_ptr<ProcessGroup> world, MeshShape shape)
    : world_(std::move(world)), shape_(resolve_mesh(shape, world_->size())) {
  const auto& d = shape_.degrees;
  int rest = world_->rank();
  for (int a = kMeshAxes - 1; a >= 0; --a) {
    coordinate_[a] = rest % d[a];
    rest /= d[a];
  }
  // Axis groups in a fixed order on every rank; groups of one axis are disjoint, so the
  // blocking joins cannot wait on each other.
  for (int a = 0; a < kMeshAxes; ++a) {
    std::vector<int> members;
    auto at = coordinate_;
    for (int i = 0; i < d[a]; ++i) {
      at[a] = i;
      members.push_back(rank_at(at));
    }
    groups_[a] = world_->new_group(members);
  }
  std::vector<int> dp_members;
  auto at = coordinate_;
  for (int r = 0; r < d[1]; ++r) {
    for (int s = 0; s < d[2]; ++s) {
      at[1] = r;
      at[2] = s;
      dp_members.push_back(rank_at(at));
    }
  }
  dp_ = world_->new_group(dp_members);
  if (d[kCpAxis] > 1) {
    MeshShape folded = shape_;
    folded.degrees[2] *= d[kCpAxis];
    folded.degrees[kCpAxis] = 1;
    folded_ = std::make_unique<DeviceMesh>(world_, folded);
    ep_ = folded_->ep_;  // experts are split on the data-parallel layout
  } else if (shape_.ep_degree > 1) {
    split_experts();
  }
}

void DeviceMesh::split_experts() {
  // dp_shard = dp_shard_mod_ep x ep, ep innermost: an ep group is ep neighbouring dp_shard
  // coordinates, and the ranks holding the same experts are every ep-th.
  const auto& d = shape_.degrees;
  const int ep = shape_.ep_degree;
  const int inner = coordinate_[2] % ep, outer = coordinate_[2] / ep;
  std::vector<int> group;
  auto at = coordinate_;
  for (int i = 0; i < ep; ++i) {
    at[2] = outer * ep + i;
    group.push_back(rank_at(at));
  }
  ep_ = world_->new_group(group);
  // The ranks holding this rank's experts, in global rank order (pp, dp_replicate, the outer
  // dp_shard coordinate, tp), which is the order of the expert mesh's own layout.
  std::vector<int> holders;
  for (int p = 0; p < d[0]; ++p) {
    for (int r = 0; r < d[1]; ++r) {
      for (int s = 0; s < d[2] / ep; ++s) {
        for (int t = 0; t < d[4]; ++t) holders.push_back(rank_at({p, r, s * ep + inner, 0, t}));
      }
    }
  }
  expert_ = std::make_unique<DeviceMesh>(
      world_->new_group(holders),
      MeshShape().pp(d[0]).dp_replicate(d[1]).dp_shard(d[2] / ep).tp(d[4]));
}

const DeviceMesh& DeviceMesh::expert_mesh() const {
  if (folded_) return folded_->expert_mesh();
  return expert_ ? *expert_ : *this;
}

DeviceMesh::~DeviceMesh() = default;

int DeviceMesh::rank_at(const std::array<int, kMeshAxes>& c) const {
  const auto& d = shape_.degrees;
  return (((c[0] * d[1] + c[1]) * d[2] + c[2]) * d[3] + c[3]) * d[4] + c[4];
}

}  // namespace shardtrain
