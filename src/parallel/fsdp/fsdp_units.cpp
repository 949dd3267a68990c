// FSDP's units: the groups their flat parameters are sharded and reduced over, the wrap
// policy's groups of blocks and the root, and the companions that take a unit's frozen
// parameters (one per dtype) and, under expert parallelism, its experts.
#include <algorithm>
#include <map>
#include <stdexcept>

#include "parallel/expert/expert_parallel.h"
#include "parallel/fsdp/unit.h"

namespace shardtrain {

FullyShardedDataParallel::Groups FullyShardedDataParallel::groups_on(const DeviceMesh& mesh,
                                                                     bool experts) const {
  const auto strategy = options_.sharding_;
  const int replicate = mesh.size(MeshAxis::kDpReplicate);
  const int shard = mesh.size(MeshAxis::kDpShard);
  Groups groups;
  groups.dp = mesh.dp_ptr();
  if (strategy == ShardingStrategy::kHybridShard) {
    // The experts' mesh may have one rank per replica holding them: replicated only, then.
    if (!experts && (replicate < 2 || shard < 2)) {
      throw std::invalid_argument(
          "hybrid_shard needs a 2-D mesh with dp_replicate > 1 and dp_shard > 1, got "
          "dp_replicate=" +
          std::to_string(replicate) + " x dp_shard=" + std::to_string(shard));
    }
    if (shard > 1) groups.shard = mesh.group_ptr(MeshAxis::kDpShard);
    if (replicate > 1) groups.replicate = mesh.group_ptr(MeshAxis::kDpReplicate);
  } else if (strategy == ShardingStrategy::kNoShard) {
    if (groups.dp->size() > 1) groups.replicate = groups.dp;
  } else {
    if (replicate != 1) {
      throw std::invalid_argument(to_string(strategy) +
                                  " shards over every data-parallel rank, but the mesh has "
                                  "dp_replicate=" +
                                  std::to_string(replicate) + "; use hybrid_shard for a 2-D mesh");
    }
    if (groups.dp->size() > 1) groups.shard = groups.dp;
  }
  if (groups.shard) {
    groups.shard_rank = groups.shard->rank();
    groups.shard_size = groups.shard->size();
  }
  return groups;
}

void FullyShardedDataParallel::choose_groups(const DeviceMesh& mesh) {
  groups_ = groups_on(mesh, /*experts=*/false);
  if (mesh.ep_size() > 1) {
    expert_groups_ = groups_on(mesh.expert_mesh(), /*experts=*/true);
    ep_group_ = mesh.ep_ptr();
  }
}

void FullyShardedDataParallel::form_units(const DeviceMesh& mesh) {
  // Units: the policy's groups of blocks in forward order, then the root with the rest.
  const auto points = model_->hook_points();
  for (size_t i = 0; i < points.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (points[i] == points[j]) {
        throw std::invalid_argument(
            "FSDP: blocks." + std::to_string(j) + " and blocks." + std::to_string(i) +
            " are the same module; a unit used twice in one forward is not supported (its "
            "parameters are freed after its first use)");
      }
    }
  }
  WrapPolicy policy = options_.wrap_;
  if (mesh.size(MeshAxis::kPp) > 1 && policy.kind == WrapPolicy::Kind::kSize) {
    // A pipeline stage's blocks that together fall short of min_params make one unit. The
    // policy would refuse them on this stage's ranks only, while the other stages waited.
    int64_t stage_params = 0;
    for (const auto& point : points) stage_params += detail::parameter_count(*point);
    policy.min_params = std::min(policy.min_params, std::max<int64_t>(stage_params, 1));
  }
  const auto groups = detail::plan_units(points, policy);
  std::map<const at::TensorImpl*, std::string> names;
  for (const auto& item : model_->named_parameters()) {
    names[item.value().unsafeGetTensorImpl()] = item.key();
  }
  std::map<const at::TensorImpl*, int> owner;
  auto add_params = [&](Unit& unit, const std::vector<at::Tensor>& params) {
    for (const auto& p : params) {
      auto [it, fresh] = owner.emplace(p.unsafeGetTensorImpl(), unit.index);
      if (!fresh) {
        throw std::invalid_argument("FSDP: parameter '" + names[p.unsafeGetTensorImpl()] +
                                    "' belongs to two units (" + units_[it->second]->name +
                                    " and " + unit.name + ")");
      }
      unit.params.push_back(p);
      unit.names.push_back(names[p.unsafeGetTensorImpl()]);
    }
  };
  for (const auto& group : groups) {
    auto unit = std::make_unique<Unit>();
    unit->index = static_cast<int>(units_.size());
    unit->name = "blocks." + std::to_string(group.front()) +
                 (group.size() > 1 ? "-" + std::to_string(group.back()) : "");
    for (size_t i : group) unit->modules.push_back(points[i].get());
    units_.push_back(std::move(unit));
    for (size_t i : group) add_params(*units_.back(), points[i]->parameters());
  }
  {
    auto root = std::make_unique<Unit>();
    root->index = static_cast<int>(units_.size());
    root->name = "root";
    root->root = true;
    units_.push_back(std::move(root));
    std::vector<at::Tensor> rest;
    for (const auto& p : model_->parameters()) {
      if (!owner.count(p.unsafeGetTensorImpl())) rest.push_back(p);
    }
    add_params(*units_.back(), rest);
  }
}

void FullyShardedDataParallel::split_frozen_parameters() {
  // Frozen parameters leave their unit's flat parameter for companions, one per dtype (unit.h).
  bool any_frozen = false;
  for (auto& unit : units_) {
    std::vector<at::Tensor> trained;
    std::vector<std::string> trained_names;
    std::vector<std::unique_ptr<Unit>> frozen;  // by dtype, in order of first appearance
    for (size_t k = 0; k < unit->params.size(); ++k) {
      const at::Tensor& p = unit->params[k];
      if (p.requires_grad()) {
        trained.push_back(p);
        trained_names.push_back(unit->names[k]);
        continue;
      }
      auto group = std::find_if(frozen.begin(), frozen.end(), [&p](const auto& f) {
        return f->params.front().scalar_type() == p.scalar_type();
      });
      if (group == frozen.end()) {
        auto companion = std::make_unique<Unit>();
        companion->index = unit->index;
        companion->name = unit->name + " (frozen " + c10::toString(p.scalar_type()) + ")";
        companion->root = unit->root;
        companion->modules = unit->modules;
        companion->frozen = true;
        frozen.push_back(std::move(companion));
        group = frozen.end() - 1;
      }
      (*group)->params.push_back(p);
      (*group)->names.push_back(unit->names[k]);
    }
    if (frozen.empty()) continue;
    any_frozen = true;
    unit->params = std::move(trained);
    unit->names = std::move(trained_names);
    if (unit->params.empty()) {
      // A unit of frozen parameters only: the first group is the unit itself.
      unit->params = std::move(frozen.front()->params);
      unit->names = std::move(frozen.front()->names);
      unit->frozen = true;
      frozen.erase(frozen.begin());
    }
    // Each companion hangs off the one before: gather, wait and release follow the chain.
    Unit* tail = unit.get();
    for (auto& f : frozen) {
      tail->companion = std::move(f);
      tail = tail->companion.get();
    }
  }
  options_.zero_.check_frozen(any_frozen);
}

void FullyShardedDataParallel::split_expert_parameters() {
  if (!ep_group_) return;
  // Each block's experts leave its flat parameter for a unit of their own on the expert mesh's
  // groups, hung at the end of the block's companions: gathered and released with the block.
  for (auto& unit : units_) {
    for (Unit* u = unit->companion.get(); u; u = u->companion.get()) {
      for (const auto& name : u->names) {
        if (detail::is_expert_tensor(name)) {
          throw std::invalid_argument("FSDP with expert parallelism: frozen expert parameter '" +
                                      name + "' is not supported");
        }
      }
    }
    auto experts = std::make_unique<Unit>();
    std::vector<at::Tensor> params;
    std::vector<std::string> names;
    for (size_t k = 0; k < unit->params.size(); ++k) {
      const bool expert = detail::is_expert_tensor(unit->names[k]);
      (expert ? experts->params : params).push_back(unit->params[k]);
      (expert ? experts->names : names).push_back(unit->names[k]);
    }
    if (experts->params.empty()) continue;
    if (params.empty()) {
      throw std::invalid_argument("FSDP with expert parallelism: unit " + unit->name +
                                  " holds experts only; wrap each block as a unit");
    }
    unit->params = std::move(params);
    unit->names = std::move(names);
    experts->index = unit->index;
    experts->name = unit->name + " (experts)";
    experts->root = unit->root;
    experts->modules = unit->modules;
    experts->groups = &expert_groups_;
    Unit* tail = unit.get();
    while (tail->companion) tail = tail->companion.get();
    tail->companion = std::move(experts);
  }
}

}  // namespace shardtrain
