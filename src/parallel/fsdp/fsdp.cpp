// FSDP construction: flat parameters and their shards for the units (fsdp_units.cpp), and the
// gathering and releasing of a unit's full parameters.
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <sstream>
#include <stdexcept>

#include "model/module_hooks.h"
#include "parallel/expert/expert_parallel.h"
#include "parallel/fsdp/unit.h"
#include "parallel/grad_hook.h"
#include "parallel/tensor/tp_state.h"

namespace shardtrain {

namespace {

// Elements [begin, begin + out.numel()) of a unit's flat parameter: the parameters' values,
// or their initialization where they have none; zeros in the padding.
template <typename UnitT>
void fill_flat(const ParameterInitializer& init, const UnitT& unit, int64_t begin,
               const at::Tensor& out) {
  const int64_t end = begin + out.numel();
  for (size_t k = 0; k < unit.params.size(); ++k) {
    const int64_t first = unit.offsets[k];
    const int64_t lo = std::max(begin, first);
    const int64_t hi = std::min(end, first + unit.params[k].numel());
    if (lo >= hi) continue;
    at::Tensor piece = out.narrow(0, lo - begin, hi - lo);
    if (is_materialized(unit.params[k])) {
      piece.copy_(unit.params[k].detach().reshape({-1}).narrow(0, lo - first, hi - lo));
    } else {
      init(unit.names[k], lo - first, piece);
    }
  }
  const int64_t pad = std::max(begin, unit.numel);
  if (pad < end) out.narrow(0, pad - begin, end - pad).zero_();
}

}  // namespace

FullyShardedDataParallel::FullyShardedDataParallel(Transformer model, const DeviceMesh& mesh,
                                                   FSDPOptions options)
    : model_(std::move(model)), options_(std::move(options)) {
  check_options(mesh);
  choose_groups(mesh);
  open_swap_dirs();
  form_units(mesh);
  split_frozen_parameters();
  split_expert_parameters();
  torch::NoGradGuard no_grad;
  // A deferred model (ModelInit().deferred()) has no parameter memory: each rank initializes
  // just the elements it holds, bit-identical to the same slice of a whole model.
  const ParameterInitializer init = model_->initializer();
  sync_module_states();
  for (auto& unit : units_) {
    for (Unit* u = unit.get(); u; u = u->companion.get()) {
      if (!u->groups) u->groups = &groups_;
      every_unit_.push_back(u);
    }
  }
  for (Unit* unit : every_unit_) {
    lay_out_flat(*unit, init);
    release(*unit);              // start sharded, unless it stays gathered
    if (unit->frozen) continue;  // nothing for the optimizer or the gradient hooks
    add_segments(*unit);
    move_shards_to_files(*unit);
    add_gradient_hooks(*unit);
  }
  install_hooks();
  install_tied_sink();
}

void FullyShardedDataParallel::check_options(const DeviceMesh& mesh) {
  // A ZeRO stage implies its sharding (src/parallel/zero/).
  options_.sharding_ = options_.zero_.sharding(options_.sharding_);
  // Across tensor-parallel ranks the model is already split (parallelize_module), and across
  // pipeline ranks it holds one stage's parts: each rank shards what it holds over its
  // data-parallel peers.
  if (mesh.size(MeshAxis::kTp) > 1 && !detail::tp_state(model_)) {
    throw std::invalid_argument(
        "FSDP on a mesh with tp=" + std::to_string(mesh.size(MeshAxis::kTp)) +
        " needs the model split first (parallelize_module)");
  }
  if (options_.limit_all_gathers_ < 1) {
    throw std::invalid_argument("FSDP limit_all_gathers must be at least 1, got " +
                                std::to_string(options_.limit_all_gathers_));
  }
}

void FullyShardedDataParallel::open_swap_dirs() {
  const auto strategy = options_.sharding_;
  const bool on_file = !options_.param_swap_dir_.empty();
  if (on_file) {
    if (strategy != ShardingStrategy::kFullShard) {
      throw std::invalid_argument(
          "FSDP: parameter shards in files (param_swap_dir) need "
          "full_shard sharding (ZeRO stage 3), not " +
          to_string(strategy));
    }
    std::error_code error;
    if (!std::filesystem::is_directory(options_.param_swap_dir_, error)) {
      throw std::invalid_argument("FSDP: the directory for parameter shards '" +
                                  options_.param_swap_dir_ + "' does not exist");
    }
  }

  const bool grads_on_file = !options_.grad_swap_dir_.empty();
  if (grads_on_file) {
    options_.zero_.check_gradients_in_files();
    std::error_code error;
    if (!std::filesystem::is_directory(options_.grad_swap_dir_, error)) {
      throw std::invalid_argument("FSDP: the directory for gradient shards '" +
                                  options_.grad_swap_dir_ + "' does not exist");
    }
  }

  if (on_file || grads_on_file) io_ = std::make_unique<detail::IoThread>();
}

void FullyShardedDataParallel::sync_module_states() {
  if (options_.sync_module_states_ && groups_.dp->size() > 1 && model_->materialized()) {
    std::vector<WorkHandle> pending;
    for (const auto& item : model_->named_parameters()) {
      // Experts differ across the ep group: each is sent among the ranks that hold it.
      const bool expert = ep_group_ && detail::is_expert_tensor(item.key());
      ProcessGroup& group = expert ? *expert_groups_.dp : *groups_.dp;
      if (group.size() > 1) pending.push_back(group.broadcast(item.value().data(), 0));
    }
    for (auto& b : model_->buffers()) pending.push_back(groups_.dp->broadcast(b, 0));
    for (auto& w : pending) w->wait();
  }
  for (auto& b : model_->buffers()) b.set_data(b.to(options_.mixed_precision_.buffer_dtype_));
}

void FullyShardedDataParallel::lay_out_flat(Unit& unit, const ParameterInitializer& init) {
  const ZeroBehaviour& zero = options_.zero_;
  const bool on_file = !options_.param_swap_dir_.empty();
  const bool grads_on_file = !options_.grad_swap_dir_.empty();
  const at::ScalarType policy_dtype = options_.mixed_precision_.param_dtype_;
  for (const auto& p : unit.params) {
    unit.offsets.push_back(unit.numel);
    unit.shapes.push_back(p.sizes().vec());
    unit.numel += p.numel();
  }
  const int shard_size = unit.groups->shard_size, shard_rank = unit.groups->shard_rank;
  unit.padded = (unit.numel + shard_size - 1) / shard_size * shard_size;
  unit.shard_numel = unit.padded / shard_size;
  // What trains keeps an fp32 master and computes in the policy's dtype. Frozen parameters
  // keep the dtype they were given (a LoRA base in bf16 stays bf16 on the wire and gathered);
  // frozen fp32 ones follow the policy.
  const at::ScalarType stored =
      unit.frozen && !unit.params.empty() ? unit.params.front().scalar_type() : at::kFloat;
  const at::ScalarType param_dtype = stored == at::kFloat ? policy_dtype : stored;
  const at::TensorOptions options =
      (unit.params.empty() ? at::TensorOptions() : unit.params.front().options()).dtype(stored);
  unit.aliased = shard_size == 1 && param_dtype == stored && !on_file;
  unit.master_in_full =
      zero.master_in_whole_parameters() && param_dtype == at::kFloat && !unit.aliased;
  if (unit.master_in_full) {
    // ZeRO-1/2 keep the whole parameters on every rank: the fp32 master is a slice of them,
    // updated in place, then all-gathered.
    unit.full = at::empty({unit.padded}, options);
    fill_flat(init, unit, 0, unit.full);
    unit.master = unit.full.narrow(0, shard_rank * unit.shard_numel, unit.shard_numel);
  } else {
    unit.master = at::empty({unit.shard_numel}, options);
    fill_flat(init, unit, shard_rank * unit.shard_numel, unit.master);
    unit.full = unit.aliased ? unit.master : at::empty({unit.padded}, options.dtype(param_dtype));
    // Only a unit that stays gathered needs its full values now; the others are released
    // below and gathered from the shards when they compute.
    if (!unit.aliased && keeps_gathered(unit)) {
      if (param_dtype == stored) {
        fill_flat(init, unit, 0, unit.full);
      } else {
        at::Tensor wide = at::empty({unit.padded}, options);
        fill_flat(init, unit, 0, wide);
        unit.full.copy_(wide);
      }
    }
  }
  // On file in half precision, the all-gather's input is cast from the master as it is read.
  if (param_dtype == stored) {
    unit.wire = unit.master;
  } else if (!on_file) {
    unit.wire = unit.master.to(param_dtype);
  }
  if (unit.frozen) {
    // no gradient shard
  } else if (zero.whole_gradients()) {
    unit.grad_full = at::zeros({unit.padded}, unit.master.options());
    unit.grad_shard = unit.grad_full.narrow(0, shard_rank * unit.shard_numel, unit.shard_numel);
    unit.grads_in_full =
        param_dtype == at::kFloat && options_.mixed_precision_.reduce_dtype_ == at::kFloat;
  } else {
    unit.grad_shard = grads_on_file ? at::empty_like(unit.master) : at::zeros_like(unit.master);
  }
  // The module's parameters become views into the flat buffer, in the compute dtype.
  for (size_t k = 0; k < unit.params.size(); ++k) {
    at::Tensor& p = unit.params[k];
    if (p.scalar_type() != param_dtype) p.set_data(at::empty({0}, options.dtype(param_dtype)));
    p.set_(unit.full.storage(), unit.offsets[k], unit.shapes[k],
           c10::contiguous_strides(unit.shapes[k]));
    // Autograd adds into a defined .grad in place, as DDP's bucket views rely on.
    p.mutable_grad() =
        unit.grads_in_full
            ? unit.grad_full.narrow(0, unit.offsets[k], p.numel()).view(unit.shapes[k])
            : at::Tensor();
  }
  unit.gathered = !unit.aliased;
  if (unit.gathered) {
    gathered_bytes_ += unit.full_bytes();
    gathered_elements_ += unit.padded;
    gathered_peak_ = std::max(gathered_peak_, gathered_bytes_);
  }
}

void FullyShardedDataParallel::add_segments(Unit& unit) {
  // The optimizer's pieces: where each parameter meets this rank's shard.
  const int64_t begin = unit.groups->shard_rank * unit.shard_numel;
  const int64_t end = begin + unit.shard_numel;
  const bool unique = !unit.groups->replicate || unit.groups->replicate->rank() == 0;
  for (size_t k = 0; k < unit.params.size(); ++k) {
    const int64_t lo = std::max(begin, unit.offsets[k]);
    const int64_t hi = std::min(end, unit.offsets[k] + unit.params[k].numel());
    if (lo >= hi) continue;
    ShardSegment segment;
    segment.name = unit.names[k];
    segment.shape = unit.shapes[k];
    segment.offset = lo - unit.offsets[k];
    segment.unit = unit.index;
    segment.shard_offset = lo - begin;
    segment.param = unit.master.narrow(0, lo - begin, hi - lo);
    segment.param.requires_grad_(true);
    segment.param.mutable_grad() = unit.grad_shard.narrow(0, lo - begin, hi - lo);
    segment.unique = unique;
    segments_.push_back(std::move(segment));
    segment_units_.push_back(&unit);
  }
}

void FullyShardedDataParallel::move_shards_to_files(Unit& unit) {
  const bool on_file = !options_.param_swap_dir_.empty();
  const bool grads_on_file = !options_.grad_swap_dir_.empty();
  if (on_file) {
    const int64_t bytes = unit.shard_numel * 4;
    unit.swap = std::make_unique<detail::SwapFile>(
        detail::unique_swap_stem(options_.param_swap_dir_, "param") + "." + unit.name, bytes);
    unit.swap->write(unit.master.data_ptr(), bytes, 0);
    drop_master(unit);
  }
  if (grads_on_file) {
    // Created as holes: nothing is written until a reduction adds into the shard.
    unit.grad_swap = std::make_unique<detail::SwapFile>(
        detail::unique_swap_stem(options_.grad_swap_dir_, "grad") + "." + unit.name,
        unit.shard_numel * 4);
    unit.grad_zero = true;
    unit.grad_squares = at::zeros({}, at::kDouble);
    detail::release_storage(unit.grad_shard);
    unit.grad_resident = false;
  }
}

void FullyShardedDataParallel::add_gradient_hooks(Unit& unit) {
  unit.ready_flags.assign(unit.params.size(), false);
  for (size_t k = 0; k < unit.params.size(); ++k) {
    Unit* target = &unit;
    grad_hooks_.emplace_back(unit.params[k], [this, target, k] {
      if (pipelined_) return;  // reduced at end_pipeline()
      if (!target->ready_flags[k]) {
        target->ready_flags[k] = true;
        if (++target->ready == target->params.size()) reduce(*target);
      }
    });
  }
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  io_.reset();  // transfers still queued use the units' files and memory
  // The sink calls into this object; one another wrapper installed since is left in place.
  if (tied_sink_ && model_->tied_gradient_sink() == tied_sink_) {
    model_->set_tied_gradient_sink(nullptr);
  }
  detail::clear_module_hooks(model_.get(), hooks_.get());
  for (const auto& [module, point] : hook_points_) detail::clear_module_hooks(module, hooks_.get());
  for (Unit* unit : every_unit_) {
    try {
      if (unit->gather_work) unit->gather_work->wait();
      for (auto& pending : unit->pending) {
        if (pending.scatter) pending.scatter->wait();
        if (pending.replicate) pending.replicate->wait();
      }
    } catch (const std::exception&) {
      // the group failed; nothing to hand back from a destructor
    }
  }
}

std::unique_ptr<FullyShardedDataParallel> flat_shard(Transformer model, const DeviceMesh& mesh,
                                                     FSDPOptions options) {
  return std::make_unique<FullyShardedDataParallel>(std::move(model), mesh, std::move(options));
}

void FullyShardedDataParallel::gather(Unit& unit, bool wait) {
  if (!unit.aliased && !unit.gathered) {
    detail::restore_storage(unit.full, unit.full_bytes());
    start_gather(unit);
    unit.gathered = true;
    gathered_bytes_ += unit.full_bytes();
    gathered_elements_ += unit.padded;
    gathered_peak_ = std::max(gathered_peak_, gathered_bytes_);
  }
  if (unit.companion) gather(*unit.companion, /*wait=*/false);
  if (wait) wait_gathered(unit);
}

void FullyShardedDataParallel::start_gather(Unit& unit) {
  if (unit.numel == 0) return;  // a pipeline stage's root may hold nothing
  bring_master(unit);
  at::Tensor input = unit.wire;
  if (unit.master_in_full) {
    input = unit.master.clone();  // the input may not alias the output
  } else if (!input.defined()) {
    input = unit.master.to(options_.mixed_precision_.param_dtype_);
  }
  if (unit.groups->shard) {
    unit.gather_input = input;
    unit.gather_work = unit.groups->shard->all_gather(input, unit.full);
  } else {
    unit.full.copy_(input);
    drop_master(unit);
  }
}

void FullyShardedDataParallel::wait_gathered(Unit& unit) {
  if (unit.gather_work) {
    unit.gather_work->wait();
    unit.gather_work.reset();
    unit.gather_input = at::Tensor();
    drop_master(unit);
  }
  if (unit.companion) wait_gathered(*unit.companion);
}

std::future<void> detail::write_behind(IoThread& io, const SwapFile& file,
                                       const at::Tensor& shard) {
  const auto bytes = static_cast<int64_t>(shard.nbytes());
  // A job's function lives as long as its future is not read: the memory leaves it as it ends.
  return io.submit([file = &file, memory = take_storage(shard), bytes]() mutable {
    const std::shared_ptr<at::DataPtr> owned = std::move(memory);
    file->write(owned->get(), bytes, 0);
  });
}

void FullyShardedDataParallel::read_master_async(Unit& unit) {
  if (!unit.swap || unit.master_resident) return;
  detail::wait_for_io(unit.master_io);  // the shard's last write
  const int64_t bytes = unit.shard_numel * 4;
  detail::restore_storage(unit.master, bytes);
  unit.master_resident = true;
  detail::SwapFile* file = unit.swap.get();
  void* data = unit.master.data_ptr();
  unit.master_io = io_->submit([file, data, bytes] { file->read(data, bytes, 0); });
}

void FullyShardedDataParallel::bring_master(Unit& unit) {
  read_master_async(unit);
  detail::wait_for_io(unit.master_io);
}

void FullyShardedDataParallel::read_grad_async(Unit& unit) {
  if (!unit.grad_swap || unit.grad_resident || unit.grad_zero) return;
  detail::wait_for_io(unit.grad_io);
  const int64_t bytes = unit.shard_numel * 4;
  detail::restore_storage(unit.grad_shard, bytes);
  unit.grad_resident = true;
  detail::SwapFile* file = unit.grad_swap.get();
  at::Tensor shard = unit.grad_shard;
  const double factor = unit.grad_factor;  // a pending clip applies as the shard is read
  unit.grad_factor = 1.0;
  unit.grad_io = io_->submit([file, shard, bytes, factor]() mutable {
    const at::Tensor into = std::move(shard);  // not kept by the job once it ends
    file->read(into.data_ptr(), bytes, 0);
    if (factor != 1.0) into.mul_(factor);
  });
}

void FullyShardedDataParallel::bring_grad(Unit& unit) {
  if (!unit.grad_swap) return;
  if (!unit.grad_resident && unit.grad_zero) {
    detail::restore_storage(unit.grad_shard, unit.shard_numel * 4);
    unit.grad_resident = true;
    unit.grad_shard.zero_();
    return;
  }
  read_grad_async(unit);
  detail::wait_for_io(unit.grad_io);
}

void FullyShardedDataParallel::drop_grad(Unit& unit, bool write) {
  if (!unit.grad_swap || !unit.grad_resident || unit.grad_held) return;
  detail::wait_for_io(unit.grad_io);  // a read still filling it
  unit.grad_resident = false;
  if (!write) {
    detail::release_storage(unit.grad_shard);
    return;
  }
  // What clip_grad_norm() and grads_finite() need, from the values as they are written.
  unit.grad_squares = unit.grad_shard.to(at::kDouble).pow(2).sum();
  unit.grad_finite = unit.grad_shard.isfinite().all().item<bool>();
  unit.grad_zero = false;
  unit.grad_factor = 1.0;
  unit.grad_io = detail::write_behind(*io_, *unit.grad_swap, unit.grad_shard);
}

void FullyShardedDataParallel::drop_master(Unit& unit) {
  if (!unit.swap || !unit.master_resident || unit.held || unit.gather_work) return;
  detail::wait_for_io(unit.master_io);
  detail::release_storage(unit.master);
  unit.master_resident = false;
}

bool FullyShardedDataParallel::keeps_gathered(const Unit& unit) const {
  return options_.zero_.keeps_gathered(unit.numel);
}

void FullyShardedDataParallel::release(Unit& unit, bool companion) {
  if (unit.companion && companion) release(*unit.companion);
  if (unit.aliased || !unit.gathered || keeps_gathered(unit)) return;
  wait_gathered(unit);  // the collective still writes into the memory
  free_gathered(unit);
}

void FullyShardedDataParallel::free_gathered(Unit& unit) {
  detail::release_storage(unit.full);
  unit.gathered = false;
  gathered_bytes_ -= unit.full_bytes();
  gathered_elements_ -= unit.padded;
}

void FullyShardedDataParallel::release_frozen_after(int index) {
  for (auto& unit : units_) {
    if (unit->index <= index || unit->root || !unit->in_backward) continue;
    if (unit->companion) release(*unit->companion);
    if (unit->frozen) release(*unit);
  }
}

void FullyShardedDataParallel::refresh(Unit& unit) {
  if (unit.wire.defined() && !unit.wire.is_same(unit.master)) unit.wire.copy_(unit.master);
  if (unit.aliased) return;
  if (!keeps_gathered(unit)) {
    release(unit);
    return;
  }
  // A unit that stays gathered takes the updated shards of every rank now.
  wait_gathered(unit);
  start_gather(unit);
}

int64_t FullyShardedDataParallel::gathered_units() const {
  int64_t count = 0;
  for (const auto& unit : units_) {
    count += (!unit->root && unit->gathered && !keeps_gathered(*unit)) ? 1 : 0;
  }
  return count;
}

void FullyShardedDataParallel::prefetch(int index) {
  if (index < 0 || index >= static_cast<int>(units_.size())) return;
  Unit& unit = *units_[index];
  if (unit.root || unit.gathered || unit.aliased) return;
  if (options_.zero_.prefetch_by_elements()) {
    const int64_t live = options_.zero_.max_live_parameters;
    if (live > 0 && gathered_elements_ + unit.padded > live) return;
  } else if (gathered_units() >= options_.limit_all_gathers_) {
    return;
  }
  gather(unit, /*wait=*/false);
}

void FullyShardedDataParallel::prefetch_ahead(int index, int step) {
  if (!options_.zero_.prefetch_by_elements()) {
    prefetch(index + step);
    read_ahead(index, step);
    return;
  }
  // DeepSpeed's stage3_prefetch_bucket_size: units ahead, up to that many elements, those
  // already gathered (or being gathered) included, so that the window moves with the unit
  // computing rather than growing by a bucket at each.
  int64_t budget = options_.zero_.prefetch_bucket_size;
  for (int i = index + step; i >= 0 && i < static_cast<int>(units_.size()); i += step) {
    const Unit& unit = *units_[i];
    if (unit.root) break;
    if (unit.padded > budget) break;
    budget -= unit.padded;
    if (!unit.gathered) prefetch(i);
  }
  read_ahead(index, step);
}

void FullyShardedDataParallel::read_ahead(int index, int step) {
  if (options_.param_swap_dir_.empty()) return;
  // The units after the ones being gathered, up to prefetch_bucket_size elements (one unit at
  // least): the shards a gather reads one or two units from now.
  int64_t budget = options_.zero_.prefetch_bucket_size;
  bool any = false;
  for (int i = index + step; i >= 0 && i < static_cast<int>(units_.size()); i += step) {
    Unit& unit = *units_[i];
    if (unit.root) break;
    if (unit.gathered || unit.master_resident) continue;
    if (any && unit.padded > budget) break;
    budget -= unit.padded;
    any = true;
    read_master_async(unit);
  }
}

}  // namespace shardtrain
