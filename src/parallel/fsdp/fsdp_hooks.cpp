// FSDP during forward and backward: gather a unit just before it computes, release it after,
// gather it again for its backward, and reduce its gradients as soon as they are complete.
#include <torch/csrc/autograd/engine.h>

#include <stdexcept>

#include "model/checkpoint.h"
#include "parallel/fsdp/unit.h"

namespace shardtrain {

// The model reports its blocks and itself; the root is the model.
class FullyShardedDataParallel::Hooks : public ForwardHooks {
 public:
  explicit Hooks(FullyShardedDataParallel& fsdp) : fsdp_(fsdp) {}
  void pre_forward(torch::nn::Module& module) override { fsdp_.pre_forward(module); }
  at::Tensor post_forward(torch::nn::Module& module, at::Tensor output) override {
    return fsdp_.post_forward(module, std::move(output));
  }

 private:
  FullyShardedDataParallel& fsdp_;
};

void FullyShardedDataParallel::install_hooks() {
  for (auto& unit : units_) {
    for (size_t m = 0; m < unit->modules.size(); ++m) {
      hook_points_[unit->modules[m]] = {unit->index, m == 0, m + 1 == unit->modules.size()};
    }
  }
  hooks_ = std::make_shared<Hooks>(*this);
  set_module_hooks(*model_, hooks_);
  for (const auto& [module, point] : hook_points_) set_module_hooks(*module, hooks_);
}

bool FullyShardedDataParallel::reshard_after_forward() const {
  return options_.sharding_ == ShardingStrategy::kFullShard ||
         options_.sharding_ == ShardingStrategy::kHybridShard;
}

void FullyShardedDataParallel::pre_forward(torch::nn::Module& module) {
  if (pipelined_) return;  // everything is gathered
  Unit& root = *units_.back();
  if (&module == model_.get()) {
    phase_ = Phase::kForward;
    ran_.clear();
    // The root's parameters (embeddings, final norm, head) are used at both ends of forward
    // and first in backward: it stays gathered until the backward ends.
    gather(root, /*wait=*/true);
    if (options_.forward_prefetch_) prefetch_ahead(-1, +1);
    return;
  }
  const auto point = hook_points_.find(&module);
  if (point == hook_points_.end()) {
    throw std::logic_error("FSDP: a module outside the model's hook points reported a forward");
  }
  Unit& unit = *units_[point->second.unit];
  if (phase_ == Phase::kBackward) {
    // Activation checkpointing recomputes the block: this is the start of its backward.
    pre_backward(unit);
    return;
  }
  if (!ran_.insert(&module).second) {
    throw std::logic_error(
        "FSDP: unit " + unit.name +
        " ran twice in one forward; full_shard frees a unit's "
        "parameters after its forward, so a module called twice needs a wrap policy that puts it "
        "in the root unit, or sharding shard_grad_op / no_shard");
  }
  gather(unit, /*wait=*/true);
  if (options_.forward_prefetch_ && point->second.last) prefetch_ahead(unit.index, +1);
}

at::Tensor FullyShardedDataParallel::post_forward(torch::nn::Module& module, at::Tensor output) {
  if (pipelined_) return output;
  if (&module == model_.get()) {
    if (!output.requires_grad()) {
      // No backward will follow (evaluation, generation): nothing stays gathered.
      for (auto& unit : units_) release(*unit);
      phase_ = Phase::kIdle;
      return output;
    }
    output.register_hook([this](const at::Tensor&) { start_backward(); });
    return output;
  }
  if (phase_ == Phase::kBackward) return output;  // a recomputation: backward needs the unit
  const auto& point = hook_points_.at(&module);
  if (!point.last) return output;
  Unit& unit = *units_[point.unit];
  if (reshard_after_forward()) release(unit);
  if (output.requires_grad()) {
    Unit* target = &unit;
    output.register_hook([this, target](const at::Tensor&) { pre_backward(*target); });
  }
  return output;
}

void FullyShardedDataParallel::start_backward() {
  if (phase_ == Phase::kBackward) return;
  phase_ = Phase::kBackward;
  // Queued from the outer backward (the gradient of the model's output), so it runs when the
  // whole backward is done, after the nested ones activation checkpointing starts.
  detail::queue_backward_callback([this] { finish_backward(); });
  units_.back()->in_backward = true;
  if (options_.backward_prefetch_ == BackwardPrefetch::kBackwardPre) {
    prefetch_ahead(static_cast<int>(units_.size()) - 1, -1);
  }
}

void FullyShardedDataParallel::pre_backward(Unit& unit) {
  if (unit.in_backward) {
    wait_gathered(unit);
    return;
  }
  unit.in_backward = true;
  release_frozen_after(unit.index);
  gather(unit, /*wait=*/true);
  if (options_.backward_prefetch_ == BackwardPrefetch::kBackwardPre) {
    prefetch_ahead(unit.index, -1);
  }
}

void FullyShardedDataParallel::begin_pipeline() {
  if (phase_ != Phase::kIdle) {
    throw std::logic_error("FSDP: begin_pipeline() during a forward or backward");
  }
  pipelined_ = true;
  for (auto& unit : units_) gather(*unit, /*wait=*/false);
  for (auto& unit : units_) wait_gathered(*unit);
}

void FullyShardedDataParallel::end_pipeline(bool gradients) {
  pipelined_ = false;
  if (gradients) {
    finish_backward();  // reduces every unit, then frees
    return;
  }
  for (auto& unit : units_) release(*unit);
}

void FullyShardedDataParallel::reduce(Unit& unit) {
  if (unit.reduced) return;
  unit.reduced = true;
  // No gradient, or (a pipeline stage's root) no parameter: nothing to communicate.
  if (unit.frozen || unit.numel == 0) return;
  if (tied_param_ >= 0 && &unit == units_.back().get()) {
    reduce_root_with_tied_rows(unit);
    reduction_issued(unit);
    return;
  }
  Unit::PendingReduce pending;
  if (unit.grads_in_full) {
    // Backward accumulated into grad_full, which also holds the average of earlier backward
    // passes since zero_grad: equal on every rank, so averaging the sum again adds this pass's
    // average to it.
    pending.output = unit.grad_full;
    if (unit.groups->dp->size() > 1)
      pending.scatter = unit.groups->dp->all_reduce(unit.grad_full, ReduceOp::kAvg);
    unit.pending.push_back(std::move(pending));
    reduction_issued(unit);
    return;
  }
  const at::ScalarType reduce_dtype = options_.mixed_precision_.reduce_dtype_;
  at::Tensor flat = at::zeros({unit.padded}, unit.master.options().dtype(reduce_dtype));
  for (size_t k = 0; k < unit.params.size(); ++k) {
    at::Tensor& grad = unit.params[k].mutable_grad();
    if (grad.defined()) {
      flat.narrow(0, unit.offsets[k], grad.numel()).copy_(grad.reshape({-1}));
      grad = at::Tensor();  // the full gradient is not kept
    }
  }
  if (options_.zero_.whole_gradients()) {
    // ZeRO-1 keeps the whole gradient: an all-reduce, of which the optimizer reads its slice.
    pending.output = flat;
    if (unit.groups->dp->size() > 1) {
      pending.scatter = unit.groups->dp->all_reduce(flat, ReduceOp::kAvg);
    }
  } else if (unit.groups->shard) {
    pending.output = at::empty({unit.shard_numel}, flat.options());
    pending.scatter = unit.groups->shard->reduce_scatter(flat, pending.output, ReduceOp::kAvg);
  } else {
    pending.output = flat;
  }
  unit.pending.push_back(std::move(pending));
  reduction_issued(unit);
}

namespace {

// Adds a completed reduction into the unit's gradient: its shard, or ZeRO-1's whole gradient
// (nothing when it was reduced there in place). A template, since Unit is private to FSDP.
template <typename Unit, typename Pending>
void add_reduced(Unit& unit, const Pending& pending) {
  if (pending.output.is_same(unit.grad_full)) return;
  if (unit.grad_full.defined()) {
    unit.grad_full.add_(pending.output);
  } else {
    unit.grad_shard.add_(pending.output.narrow(0, 0, unit.shard_numel));
  }
}

}  // namespace

void FullyShardedDataParallel::reduction_issued(Unit& unit) {
  // The reductions of earlier units go into their gradient shards now, so that backward holds
  // the reduced output of about one unit beside the shards rather than one per unit until it
  // ends (4·N/W more bytes at the peak). The values and the order of the additions into each
  // shard are unchanged. Under hybrid_shard they wait: the all-reduce across replicas is issued
  // at the end of backward.
  for (Unit* other : every_unit_) {
    if (other == &unit || other->pending.empty() || other->groups->replicate) continue;
    bring_grad(*other);
    for (auto& earlier : other->pending) {
      if (earlier.scatter) earlier.scatter->wait();
      add_reduced(*other, earlier);
    }
    other->pending.clear();
    drop_grad(*other, /*write=*/true);
  }
  // This unit's shard is read while the next unit's backward computes.
  if (!unit.groups->replicate) read_grad_async(unit);
  const Unit::PendingReduce& pending = unit.pending.back();
  if (pending.scatter) pace_reduction(pending.scatter, unit.padded);
  // Backward is done with this unit's trained parameters. Its frozen ones may still be needed
  // for the gradient of the unit's input (a LoRA base layer computes it after its adapter's
  // gradients are in): release_frozen_after() frees them.
  if (!unit.aliased && unit.groups->shard) release(unit, /*companion=*/false);
  if (options_.backward_prefetch_ == BackwardPrefetch::kBackwardPost) {
    prefetch_ahead(unit.index, -1);
  }
}

void FullyShardedDataParallel::pace_reduction(const WorkHandle& work, int64_t elements) {
  // DeepSpeed's overlap_comm off: each reduction is waited for as it is issued; on, with
  // reduce_bucket_size: at most that many gradient elements in flight.
  if (!options_.zero_.overlap_comm) {
    work->wait();
    return;
  }
  if (options_.zero_.reduce_bucket_size <= 0) return;
  reductions_in_flight_.emplace_back(work, elements);
  int64_t in_flight = 0;
  for (const auto& item : reductions_in_flight_) in_flight += item.second;
  while (in_flight > options_.zero_.reduce_bucket_size && reductions_in_flight_.size() > 1) {
    reductions_in_flight_.front().first->wait();
    in_flight -= reductions_in_flight_.front().second;
    reductions_in_flight_.erase(reductions_in_flight_.begin());
  }
}

void FullyShardedDataParallel::finish_backward() {
  // Units whose parameters got no gradient (unused in this pass) still take part, with zeros,
  // so that every rank issues the same collectives.
  for (auto it = every_unit_.rbegin(); it != every_unit_.rend(); ++it) reduce(**it);
  for (Unit* unit : every_unit_) {
    for (auto& pending : unit->pending) {
      if (pending.scatter) pending.scatter->wait();
      if (unit->groups->replicate) {
        pending.replicate = unit->groups->replicate->all_reduce(pending.output, ReduceOp::kAvg);
      }
    }
  }
  for (Unit* unit : every_unit_) {
    if (!unit->pending.empty()) bring_grad(*unit);
    for (auto& pending : unit->pending) {
      if (pending.replicate) pending.replicate->wait();
      add_reduced(*unit, pending);
    }
    if (!unit->pending.empty()) drop_grad(*unit, /*write=*/true);
    unit->pending.clear();
    unit->end_backward();
    release(*unit);
  }
  reductions_in_flight_.clear();
  phase_ = Phase::kIdle;
}

void FullyShardedDataParallel::abandon_pass() {
  // The failed group's operations are not waited for: their results are not used, and the
  // memory they wrote into is dropped with them.
  reductions_in_flight_.clear();
  tied_lookups_.clear();
  tied_flat_ = at::Tensor();
  for (Unit* unit : every_unit_) {
    unit->pending.clear();
    unit->end_backward();
    unit->gather_work.reset();
    unit->gather_input = at::Tensor();
    if (!unit->grads_in_full) {
      for (auto& param : unit->params) param.mutable_grad() = at::Tensor();
    }
    // A copy kept gathered may be part-written too: the next gather makes it again.
    if (!unit->aliased && unit->gathered) free_gathered(*unit);
    drop_master(*unit);
  }
  ran_.clear();
  phase_ = Phase::kIdle;
}

}  // namespace shardtrain
