// A fully_shard'ed module's shards and their gathered copies: construction, gather, free, and
// the layout that maps each parameter's dim-0 rows onto the ranks.
#include "parallel/fsdp/shard_group.h"

#include <algorithm>
#include <stdexcept>

#include "model/init.h"

namespace shardtrain::detail {
namespace {

// The padded rows of `param` as laid out in a [shard size, total] buffer: rank r's rows sit in
// row r, columns [offset, offset + rows_per_rank * row_numel). Copies `full` ([rows, row_numel]
// rows) in (to_buffer) or out. The padding is left as it is.
void copy_rows(const ShardParam& p, const at::Tensor& buffer, int64_t ranks, const at::Tensor& full,
               bool to_buffer) {
  const int64_t per = p.rows_per_rank;
  at::Tensor slots =
      buffer.view({ranks, -1}).narrow(1, p.offset, p.padded_numel()).view({ranks, per, p.row_numel});
  at::Tensor rows = full.reshape({p.rows, p.row_numel});
  const int64_t whole = p.rows / per;  // ranks whose rows are all real
  const int64_t rest = p.rows - whole * per;
  auto move = [to_buffer](const at::Tensor& slot, const at::Tensor& row) {
    if (to_buffer) {
      slot.copy_(row);
    } else {
      row.copy_(slot);
    }
  };
  if (whole > 0) move(slots.narrow(0, 0, whole), rows.narrow(0, 0, whole * per).view({whole, per, p.row_numel}));
  if (rest > 0) move(slots.select(0, whole).narrow(0, 0, rest), rows.narrow(0, whole * per, rest));
}

}  // namespace

ShardGroup::ShardGroup(torch::nn::Module& module, const DeviceMesh& mesh, FullyShardOptions options)
    : module_(&module), options_(std::move(options)) {
  const int stage = options_.zero_stage_;
  if (stage < 0 || stage > 3) {
    throw std::invalid_argument("fully_shard: zero_stage must be 0, 1, 2 or 3, got " +
                                std::to_string(stage));
  }
  if (stage == 3) options_.reshard_after_forward_ = true;
  if (stage == 1 || stage == 2) options_.reshard_after_forward_ = false;
  if (mesh.size(MeshAxis::kDpShard) > 1) shard_group_ = mesh.group_ptr(MeshAxis::kDpShard);
  if (mesh.size(MeshAxis::kDpReplicate) > 1) {
    replicate_group_ = mesh.group_ptr(MeshAxis::kDpReplicate);
  }
  dp_group_ = mesh.dp_ptr();
  shard_size_ = mesh.size(MeshAxis::kDpShard);
  shard_rank_ = mesh.coordinate(MeshAxis::kDpShard);
  for (const auto& m : module_->modules(/*include_self=*/true)) subtree_.insert(m.get());
  tree_.emplace_back("", this);
}

ShardGroup::~ShardGroup() {
  try {
    for (auto& work : gather_works_) work->wait();
    if (pending_ && pending_->work) pending_->work->wait();
  } catch (const std::exception&) {
    // A failed collective was reported where it was awaited; nothing is left to do with it.
  }
}

void ShardGroup::shard(std::vector<std::pair<std::string, at::Tensor>> params,
                       std::vector<at::Tensor> buffers) {
  torch::NoGradGuard no_grad;
  for (auto& [name, tensor] : params) {
    ShardParam p;
    p.name = name;
    p.param = tensor;
    p.shape = tensor.sizes().vec();
    p.rows = tensor.dim() == 0 ? 1 : tensor.size(0);
    p.row_numel = tensor.numel() / p.rows;
    p.rows_per_rank = (p.rows + shard_size_ - 1) / shard_size_;
    p.row_begin = std::min(p.rows, shard_rank_ * p.rows_per_rank);
    p.local_rows = std::min(p.rows_per_rank, p.rows - p.row_begin);
    p.offset = total_;
    p.trainable = tensor.requires_grad();
    total_ += p.padded_numel();
    has_frozen_ = has_frozen_ || !p.trainable;
    trainable_ += p.trainable ? 1 : 0;
    params_.push_back(std::move(p));
  }
  // The shards live where the parameters do. Host-memory shards for CUDA parameters would need
  // a copy to the device around every gather and reduction, which this path does not do yet.
  const at::Device device = params_.empty() ? at::Device(at::kCPU) : params_.front().param.device();
  if (options_.cpu_offload_ && !device.is_cpu()) {
    throw std::invalid_argument(
        "fully_shard: cpu_offload is not supported for parameters on " + device.str() +
        "; fully_shard keeps the shards on the parameters' device");
  }
  const at::TensorOptions fp32 = at::TensorOptions().dtype(at::kFloat).device(device);
  master_ = at::zeros({total_}, fp32);

  // Rank 0's values everywhere, for parameters that have memory, and for the buffers.
  if (options_.sync_module_states_ && dp_group_->size() > 1) {
    std::vector<WorkHandle> pending;
    for (auto& p : params_) {
      if (is_materialized(p.param)) pending.push_back(dp_group_->broadcast(p.param.detach(), 0));
    }
    for (auto& b : buffers) pending.push_back(dp_group_->broadcast(b, 0));
    for (auto& w : pending) w->wait();
  }
  const at::ScalarType buffer_dtype = options_.mixed_precision_.buffer_dtype_;
  for (auto& b : buffers) {
    if (at::isFloatingType(b.scalar_type()) && b.scalar_type() != buffer_dtype) {
      b.set_data(b.to(buffer_dtype));
    }
  }

  const at::ScalarType param_dtype = options_.mixed_precision_.param_dtype_;
  for (auto& p : params_) {
    at::Tensor region = master_.narrow(0, p.offset, p.local_numel());
    if (is_materialized(p.param)) {
      region.copy_(p.param.detach().reshape({-1}).narrow(0, p.row_begin * p.row_numel,
                                                           p.local_numel()));
    } else if (options_.init_) {
      options_.init_(p.name, p.row_begin * p.row_numel, region);
    } else {
      throw std::invalid_argument("fully_shard: parameter '" + p.name +
                                  "' has no memory (a deferred module) and FullyShardOptions::"
                                  "init is not set, so its values are unknown");
    }
    std::vector<int64_t> local_shape = p.shape;
    if (local_shape.empty()) local_shape.push_back(1);
    local_shape[0] = p.local_rows;
    p.local = region.view(local_shape);
    if (p.trainable) {
      p.local.requires_grad_(true);
      // Its own tensor, not a view: optimizers detach gradients in place.
      p.local.mutable_grad() = at::zeros(local_shape, fp32);
    }
    // The module's tensor keeps its shape (autograd saves it by identity) in the compute dtype;
    // its memory comes and goes with the gathers.
    p.param.set_data(at::empty(p.shape, p.param.options().dtype(param_dtype)));
    release_storage(p.param);
  }
  hook_gradients();
}

void ShardGroup::adopt(const std::string& prefix, std::shared_ptr<FSDPModule> inner,
                       ShardGroup& group) {
  if (!group.owner_) group.owner_ = this;
  tree_.insert(tree_.end() - 1, {prefix, &group});
  if (inner) inner_.push_back(std::move(inner));
}

void ShardGroup::hook_gradients() {
  for (size_t k = 0; k < params_.size(); ++k) {
    if (!params_[k].trainable) continue;
    grad_hooks_.emplace_back(params_[k].param, [this, k] {
      ShardParam& p = params_[k];
      if (!p.ready) {
        p.ready = true;
        if (++ready_ == trainable_) post_backward();
      }
    });
  }
}

void ShardGroup::unshard(bool async) {
  if (unsharded_ || gathering_) {
    if (!async) wait_for_unshard();
    return;
  }
  gathering_ = true;
  const at::ScalarType param_dtype = options_.mixed_precision_.param_dtype_;
  gather_in_ = param_dtype == at::kFloat ? master_ : master_.to(param_dtype);
  torch::NoGradGuard no_grad;
  for (auto& p : params_) {
    // One all-gather per parameter, straight into its memory: rank r's rows land after rank
    // r-1's, which is the parameter's own row order, so nothing is copied out afterwards. The
    // memory is padded to whole shards; the parameter views its first `rows` rows. `out` is a
    // tensor of its own on that memory, so writing it does not count as changing the parameter
    // (which autograd may have saved in forward, for its backward).
    const int64_t gathered = p.padded_numel() * shard_size_;
    restore_storage(p.param, gathered * static_cast<int64_t>(p.param.element_size()));
    at::Tensor in = gather_in_.narrow(0, p.offset, p.padded_numel());
    at::Tensor out = at::empty({0}, p.param.options().requires_grad(false))
                         .set_(p.param.storage(), 0, {gathered}, {1});
    if (shard_group_) {
      gather_works_.push_back(shard_group_->all_gather(in, out));
    } else {
      out.copy_(in);
    }
  }
  if (!async) wait_for_unshard();
}

void ShardGroup::wait_for_unshard() {
  if (unsharded_) return;
  if (!gathering_) unshard(/*async=*/true);
  for (auto& work : gather_works_) work->wait();
  gather_works_.clear();
  gather_in_ = at::Tensor();
  gathering_ = false;
  unsharded_ = true;
}

void ShardGroup::reshard() {
  if (gathering_) wait_for_unshard();
  if (!unsharded_) return;
  for (auto& p : params_) release_storage(p.param);
  unsharded_ = false;
}

std::vector<at::Tensor> ShardGroup::gather_full() const {
  at::Tensor all = master_;
  if (shard_group_ && total_ > 0) {
    all = at::empty({total_ * shard_size_}, master_.options());
    shard_group_->all_gather(master_, all)->wait();
  }
  std::vector<at::Tensor> out;
  for (const auto& p : params_) {
    at::Tensor full = at::empty(p.shape, master_.options());
    copy_rows(p, all, shard_size_, full, /*to_buffer=*/false);
    out.push_back(full);
  }
  return out;
}

void ShardGroup::reduce() {
  if (reduced_) return;
  reduced_ = true;
  if (trainable_ == 0) return;  // frozen: nothing to reduce
  PendingReduce pending;
  const at::ScalarType reduce_dtype = options_.mixed_precision_.reduce_dtype_;
  at::Tensor flat = at::zeros({total_ * shard_size_}, master_.options().dtype(reduce_dtype));
  {
    torch::NoGradGuard no_grad;
    for (auto& p : params_) {
      at::Tensor& grad = p.param.mutable_grad();
      if (!grad.defined()) continue;
      copy_rows(p, flat, shard_size_, grad, /*to_buffer=*/true);
      grad = at::Tensor();  // the whole gradient is not kept
    }
  }
  if (options_.zero_stage_ == 1) {
    // ZeRO-1 reduces the whole gradient; each rank keeps its rows.
    if (dp_group_->size() > 1) pending.work = dp_group_->all_reduce(flat, ReduceOp::kAvg);
    pending.output = flat.view({shard_size_, total_}).select(0, shard_rank_);
  } else if (shard_group_) {
    pending.output = at::empty({total_}, flat.options());
    pending.work = shard_group_->reduce_scatter(flat, pending.output, ReduceOp::kAvg);
  } else {
    pending.output = flat;
  }
  pending_ = std::move(pending);
}

void ShardGroup::finish_reduce() {
  if (!pending_) return;
  if (pending_->work) pending_->work->wait();
  if (replicate_group_ && options_.zero_stage_ != 1) {
    // Hybrid sharding: the replicas' shards of the same rows are averaged too.
    replicate_group_->all_reduce(pending_->output, ReduceOp::kAvg)->wait();
  }
  torch::NoGradGuard no_grad;
  for (auto& p : params_) {
    if (!p.trainable) continue;
    at::Tensor& grad = p.local.mutable_grad();
    at::Tensor rows = pending_->output.narrow(0, p.offset, p.local_numel()).view(p.local.sizes());
    // The optimizer may have set the gradient to none (zero_grad).
    if (grad.defined()) {
      grad.add_(rows);
    } else {
      grad = rows.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
    }
  }
  pending_.reset();
}

}  // namespace shardtrain::detail
