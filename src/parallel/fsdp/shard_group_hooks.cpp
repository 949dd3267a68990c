// A fully_shard'ed module during forward and backward: gathered just before it computes, freed
// after (reshard_after_forward), gathered again when its backward starts, its gradients
// reduce-scattered once they are all in, and everything finished when the root's backward ends.
#include <torch/csrc/autograd/engine.h>

#include <algorithm>
#include <stdexcept>

#include "model/checkpoint.h"
#include "parallel/fsdp/shard_group.h"

namespace shardtrain::detail {

bool ShardGroup::reshard_after_forward() const { return options_.reshard_after_forward_; }

std::optional<at::ScalarType> ShardGroup::input_dtype() const {
  const at::ScalarType dtype = options_.mixed_precision_.param_dtype_;
  if (dtype == at::kFloat) return std::nullopt;
  return dtype;
}

ShardGroup* ShardGroup::forward_root() {
  // Only a root has a phase: the nearest sharded module around this one that is running.
  for (ShardGroup* up = owner_; up; up = up->owner_) {
    if (up->phase_ != Phase::kIdle) return up;
  }
  return nullptr;
}

void ShardGroup::pre_forward(torch::nn::Module&) {
  ShardGroup* root = forward_root();
  if (!root) {
    if (owner_) {
      throw std::logic_error(
          "fully_shard: module " + module_->name() +
          " ran outside the forward of the sharded module that contains it; call that module "
          "through shardtrain::call too, so that its own parameters are gathered");
    }
    // The root: its parameters are used at both ends of forward and first in backward, so they
    // stay gathered until the backward ends.
    phase_ = Phase::kForward;
    forward_order_.clear();
    root_ = this;
    unshard(/*async=*/false);
    prefetch(forward_prefetch);
    return;
  }
  root_ = root;
  if (root->phase_ == Phase::kBackward) {
    // Activation checkpointing recomputes the module inside backward.
    unshard(/*async=*/false);
    return;
  }
  root->forward_order_.push_back(this);
  unshard(/*async=*/false);
  prefetch(forward_prefetch);
}

at::Tensor ShardGroup::post_forward(torch::nn::Module&, at::Tensor output) {
  if (root_ == this) {
    if (!output.defined() || !output.requires_grad()) {
      // No backward follows (evaluation): nothing stays gathered.
      for (auto& [prefix, group] : tree_) group->reshard();
      phase_ = Phase::kIdle;
      return output;
    }
    output.register_hook([this](const at::Tensor&) { start_backward(); });
    return output;
  }
  if (root_ && root_->phase_ == Phase::kBackward) return output;  // a recomputation
  // A forward that returned no single tensor gives no hook for its backward: stay gathered.
  if (!output.defined()) return output;
  if (reshard_after_forward()) reshard();
  if (output.requires_grad()) output.register_hook([this](const at::Tensor&) { pre_backward(); });
  return output;
}

void ShardGroup::prefetch(const std::vector<std::weak_ptr<FSDPModule>>& modules) {
  for (const auto& weak : modules) {
    if (auto handle = weak.lock()) handle->unshard(/*async=*/true);
  }
}

void ShardGroup::start_backward() {
  if (phase_ == Phase::kBackward) return;
  phase_ = Phase::kBackward;
  // Queued from the outer backward, so it runs when the whole backward is done (after the
  // nested ones activation checkpointing starts).
  detail::queue_backward_callback([this] { finish_backward(); });
  in_backward_ = true;
  if (!backward_prefetch.empty()) {
    prefetch(backward_prefetch);
  } else if (!forward_order_.empty()) {
    forward_order_.back()->unshard(/*async=*/true);
  }
}

void ShardGroup::pre_backward() {
  if (in_backward_) return;
  in_backward_ = true;
  unshard(/*async=*/false);
  if (!backward_prefetch.empty()) {
    prefetch(backward_prefetch);
    return;
  }
  // Without a list: the module that ran before this one in forward runs next in backward.
  if (!root_) return;
  const auto& order = root_->forward_order_;
  const auto it = std::find(order.begin(), order.end(), this);
  if (it != order.end() && it != order.begin()) (*(it - 1))->unshard(/*async=*/true);
}

void ShardGroup::post_backward() {
  if (sync) {
    reduce();
    // The reductions of the groups before this one go into their shards now, so that backward
    // holds about one group's reduced output beside the shards rather than one per group.
    if (root_) {
      for (auto& [prefix, group] : root_->tree_) {
        if (group != this) group->finish_reduce();
      }
    }
  }
  // A frozen parameter's values may still be needed by the backward of an earlier operation in
  // the module, and nothing says when it is done with them: such groups free at the end.
  if (reshard_after_backward && !has_frozen_ && root_ != this) reshard();
}

void ShardGroup::finish_backward() {
  // Groups whose parameters got no gradient in this pass (unused, or the graph did not reach
  // them) take part with zeros, so that every rank issues the same collectives.
  for (auto it = tree_.rbegin(); it != tree_.rend(); ++it) {
    if (it->second->sync) it->second->reduce();
  }
  for (auto& [prefix, group] : tree_) {
    group->finish_reduce();
    group->in_backward_ = false;
    group->reduced_ = false;
    group->ready_ = 0;
    for (auto& p : group->params_) p.ready = false;
    if (group->reshard_after_backward) group->reshard();
  }
  phase_ = Phase::kIdle;
}

}  // namespace shardtrain::detail
