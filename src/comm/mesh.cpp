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
  }
}

DeviceMesh::~DeviceMesh() = default;

int DeviceMesh::rank_at(const std::array<int, kMeshAxes>& c) const {
  const auto& d = shape_.degrees;
  return (((c[0] * d[1] + c[1]) * d[2] + c[2]) * d[3] + c[3]) * d[4] + c[4];
}

}  // namespace shardtrain
