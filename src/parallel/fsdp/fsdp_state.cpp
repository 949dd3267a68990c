// FSDP between backward passes: what the optimizer sees (the shards), gradient clipping and
// loss scaling over shards, full tensors for checkpoints, and memory accounting.
#include <cmath>
#include <map>

#include "parallel/fsdp/unit.h"
#include "parallel/tensor/tp_state.h"

namespace shardtrain {

void FullyShardedDataParallel::zero_grad() {
  for (Unit* unit : every_unit_) {
    if (unit->frozen) continue;
    if (unit->grad_in_file()) {
      // The file is not touched: the next reduction starts from zeros instead of reading it.
      unit->grad_zero = true;
      unit->grad_factor = 1.0;
      unit->grad_squares = at::zeros({}, at::kDouble);
      unit->grad_finite = true;
      continue;
    }
    (unit->grad_full.defined() ? unit->grad_full : unit->grad_shard).zero_();
  }
}

double FullyShardedDataParallel::clip_grad_norm(double max_norm, ProcessGroup* stages,
                                                const std::set<std::string>& counted_elsewhere) {
  // Squares of everything but the experts, and of the experts (expert parallelism).
  at::Tensor squares = at::zeros({2}, at::kDouble);
  auto kind = [this](const Unit& unit) { return unit.groups == &expert_groups_ ? 1 : 0; };
  const auto& tp = detail::tp_state(model_);
  if (tp || !counted_elsewhere.empty()) {
    // Split by tensor parallelism, the group's ranks hold different slices of split parameters
    // and the same replicated ones: each replicated piece counts 1/tp on every rank, so that
    // the sum over the group counts it once.
    for (size_t i = 0; i < segments_.size(); ++i) {
      const ShardSegment& segment = segments_[i];
      const at::Tensor& grad = segment.param.grad();
      if (!grad.defined() || counted_elsewhere.count(segment.name)) continue;
      const double weight = !tp || tp->layout_of(segment.name) ? 1.0 : 1.0 / tp->size();
      squares[kind(*segment_units_[i])] += grad.to(at::kDouble).pow(2).sum() * weight;
    }
  } else {
    for (Unit* unit : every_unit_) {
      if (unit->frozen) continue;
      // A shard in its file: the sum kept from when it was written (the same computation).
      squares[kind(*unit)] +=
          unit->grad_in_file() ? unit->grad_squares : unit->grad_shard.to(at::kDouble).pow(2).sum();
    }
  }
  // Shards are disjoint inside the shard group and identical across replicas; the experts'
  // shards are so inside the expert mesh's shard group, and the experts differ across the ep
  // group.
  at::Tensor dense = squares.narrow(0, 0, 1), experts = squares.narrow(0, 1, 1).clone();
  if (groups_.shard) groups_.shard->all_reduce(dense, ReduceOp::kSum)->wait();
  if (ep_group_) {
    if (expert_groups_.shard) expert_groups_.shard->all_reduce(experts, ReduceOp::kSum)->wait();
    ep_group_->all_reduce(experts, ReduceOp::kSum)->wait();
  }
  at::Tensor total = dense + experts;
  if (tp) tp->group->all_reduce(total, ReduceOp::kSum)->wait();
  if (stages && stages->size() > 1) stages->all_reduce(total, ReduceOp::kSum)->wait();
  const double norm = std::sqrt(total.item<double>());
  if (max_norm > 0 && norm > max_norm) {
    const double factor = max_norm / (norm + 1e-6);
    for (Unit* unit : every_unit_) {
      if (unit->frozen) continue;
      if (unit->grad_in_file()) {
        unit->grad_factor = factor;  // applied as the shard is read
      } else {
        unit->grad_shard.mul_(factor);
      }
    }
  }
  return norm;
}

bool FullyShardedDataParallel::grads_finite() {
  bool finite = true;
  for (Unit* unit : every_unit_) {
    if (unit->frozen) continue;
    finite = finite && (unit->grad_in_file() ? unit->grad_finite
                                             : unit->grad_shard.isfinite().all().item<bool>());
  }
  at::Tensor bad = at::tensor(finite ? 0.0 : 1.0, at::kDouble);
  // Every data-parallel rank (the experts' holders among them) agrees.
  if (groups_.dp->size() > 1) groups_.dp->all_reduce(bad, ReduceOp::kMax)->wait();
  if (const auto& tp = detail::tp_state(model_)) tp->group->all_reduce(bad, ReduceOp::kMax)->wait();
  return bad.item<double>() == 0.0;
}

void FullyShardedDataParallel::unscale(double scale) {
  for (Unit* unit : every_unit_) {
    if (unit->frozen) continue;
    const bool on_file = unit->grad_in_file();
    bring_grad(*unit);
    unit->grad_shard.div_(scale);
    if (on_file) drop_grad(*unit, /*write=*/true);
  }
}

void FullyShardedDataParallel::after_optimizer_step() {
  // DeepSpeed's allgather_bucket_size: at most that many elements being gathered at once.
  const int64_t bucket = options_.zero_.allgather_bucket_size;
  int64_t in_flight = 0;
  std::vector<Unit*> flying;
  for (Unit* unit : every_unit_) {
    refresh(*unit);
    if (unit->gather_work && bucket > 0) {
      flying.push_back(unit);
      in_flight += unit->padded;
      while (in_flight > bucket && flying.size() > 1) {
        wait_gathered(*flying.front());
        in_flight -= flying.front()->padded;
        flying.erase(flying.begin());
      }
    }
  }
  store_shards();
}

void FullyShardedDataParallel::load_shards(int unit, bool gradients) {
  // Every read is queued first, then each is waited for: the I/O thread works through them
  // while the first ones are taken.
  for (auto& u : units_) {
    if (unit >= 0 && u->index != unit) continue;
    read_master_async(*u);
    if (gradients) read_grad_async(*u);
  }
  for (auto& u : units_) {
    if (unit >= 0 && u->index != unit) continue;
    if (u->swap) {
      bring_master(*u);
      u->held = true;
    }
    if (u->grad_swap && gradients) {
      bring_grad(*u);
      u->grad_held = true;
    }
  }
}

void FullyShardedDataParallel::prefetch_shards(int unit) {
  if (unit < 0 || unit >= static_cast<int>(units_.size())) return;
  read_master_async(*units_[unit]);
  read_grad_async(*units_[unit]);
}

void FullyShardedDataParallel::store_shards(int unit) {
  for (auto& u : units_) {
    if (unit >= 0 && u->index != unit) continue;
    if (u->grad_held) {
      // The optimizer step consumed the gradient: its memory goes, and the next zero_grad()
      // starts the file over. Until then it reads as it was (file, then the pending factor).
      u->grad_held = false;
      drop_grad(*u, /*write=*/false);
    }
    if (!u->swap || !u->held) continue;
    u->held = false;
    if (u->gather_work) {
      // A gather still sends from the shard: written now, freed when the gather completes.
      detail::IoWaitTimer waiting;
      u->swap->write(u->master.data_ptr(), u->shard_numel * 4, 0);
      continue;
    }
    // The memory goes with the write on the I/O thread; a read of this shard queues after it.
    detail::wait_for_io(u->master_io);
    u->master_io = detail::write_behind(*io_, *u->swap, u->master);
    u->master_resident = false;
  }
}

void FullyShardedDataParallel::split_full(const Unit& unit, const at::Tensor& shard,
                                          std::vector<std::pair<std::string, at::Tensor>>& out) {
  at::Tensor full = shard;
  if (unit.groups->shard) {
    full = at::empty({unit.padded}, shard.options());
    unit.groups->shard->all_gather(shard.contiguous(), full)->wait();
  }
  for (size_t k = 0; k < unit.params.size(); ++k) {
    int64_t numel = 1;
    for (int64_t d : unit.shapes[k]) numel *= d;
    out.emplace_back(unit.names[k],
                     full.narrow(0, unit.offsets[k], numel).view(unit.shapes[k]).clone());
  }
}

std::vector<std::pair<std::string, at::Tensor>> FullyShardedDataParallel::full_parameters() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& unit : units_) {
    bring_master(*unit);
    split_full(*unit, unit->master, out);
    drop_master(*unit);
    for (Unit* c = unit->companion.get(); c; c = c->companion.get()) split_full(*c, c->master, out);
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> FullyShardedDataParallel::full_state(
    const std::function<at::Tensor(size_t)>& state_of) {
  std::map<const Unit*, at::Tensor> shards;
  for (Unit* unit : every_unit_) shards[unit] = at::zeros_like(unit->master);
  for (size_t i = 0; i < segments_.size(); ++i) {
    const ShardSegment& segment = segments_[i];
    const at::Tensor piece = state_of(i);
    if (piece.defined()) {
      shards[segment_units_[i]].narrow(0, segment.shard_offset, segment.param.numel()).copy_(piece);
    }
  }
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (Unit* unit : every_unit_) {
    if (!unit->frozen) split_full(*unit, shards[unit], out);
  }
  return out;
}

std::vector<std::pair<at::Tensor, at::Tensor>> FullyShardedDataParallel::flat_shards() const {
  std::vector<std::pair<at::Tensor, at::Tensor>> shards;
  for (const auto& unit : units_) shards.emplace_back(unit->master, unit->grad_shard);
  return shards;
}

std::vector<std::vector<std::string>> FullyShardedDataParallel::unit_layout() const {
  std::vector<std::vector<std::string>> layout;
  for (const auto& unit : units_) layout.push_back(unit->names);
  return layout;
}

FSDPMemory FullyShardedDataParallel::memory() const {
  FSDPMemory memory;
  for (const auto& top : units_) {
    // A unit with companions counts their bytes with its own.
    int64_t companion_full = 0;
    for (const Unit* c = top->companion.get(); c; c = c->companion.get()) {
      memory.param_shards += static_cast<int64_t>(c->master.nbytes());
      if (c->wire.defined() && !c->wire.is_same(c->master)) {
        memory.param_shards += static_cast<int64_t>(c->wire.nbytes());
      }
      companion_full += c->full_bytes();
    }
    const Unit* unit = top.get();
    // With master_in_full the master is part of the gathered parameters, counted there.
    const auto master_bytes = static_cast<int64_t>(unit->master.nbytes());
    if (unit->swap) memory.param_shards_on_file += master_bytes;
    if (!unit->master_in_full && unit->master_resident) memory.param_shards += master_bytes;
    if (unit->wire.defined() && !unit->wire.is_same(unit->master)) {
      memory.param_shards += static_cast<int64_t>(unit->wire.nbytes());
    }
    for (const Unit* c = top->companion.get(); c; c = c->companion.get()) {
      if (c->grad_shard.defined())
        memory.grad_shards += static_cast<int64_t>(c->grad_shard.nbytes());
    }
    const at::Tensor& grad = unit->grad_full.defined() ? unit->grad_full : unit->grad_shard;
    const int64_t grad_bytes = grad.defined() ? static_cast<int64_t>(grad.nbytes()) : 0;
    if (unit->grad_swap) memory.grad_shards_on_file += grad_bytes;
    if (!unit->grad_swap || unit->grad_resident) memory.grad_shards += grad_bytes;
    if (keeps_gathered(*unit)) memory.resident_full += unit->full_bytes();
    if (unit->root) {
      memory.root_unit = unit->full_bytes() + companion_full;
    } else {
      memory.largest_unit = std::max(memory.largest_unit, unit->full_bytes() + companion_full);
    }
  }
  memory.gathered = gathered_bytes_;
  memory.gathered_peak = gathered_peak_;
  return memory;
}

void FullyShardedDataParallel::reset_peak() { gathered_peak_ = gathered_bytes_; }

}  // namespace shardtrain
