// FSDP's reduction of a tied embedding's gradient in two parts (model/tied_gradient.h). The
// root unit holds the token embedding, which is also the head: its gradient is complete only
// when the lookup's backward ends the whole backward, so reduced as one tensor it is a
// reduce-scatter of [vocabulary x d_model] after the last block, with no compute left to hide
// it (and, on GPT-2's vocabulary, most of the model's bytes). Taken apart, the head's dense part
// is reduce-scattered as soon as the loss's backward forms it, behind the blocks' backward, and
// the lookup's part, one row per token, is gathered from every rank at the end and added into
// the shard: no dense gradient of the lookup is ever formed.
#include <algorithm>

#include "model/tied_gradient.h"
#include "parallel/fsdp/unit.h"
#include "parallel/tensor/tp_state.h"

namespace shardtrain {

void FullyShardedDataParallel::install_tied_sink() {
  const Unit& root = *units_.back();
  // One whole trained tensor at both ends, sharded within one group whose reduce-scatter
  // leaves each rank its shard (not ZeRO-1's whole gradients or hybrid_shard's second
  // reduction).
  if (!model_->config().tie_embeddings || !model_->parts().embedding || !model_->parts().head ||
      detail::tp_state(model_) || root.frozen || !root.groups->shard || root.groups->replicate ||
      root.grads_in_full || options_.zero_.whole_gradients()) {
    return;
  }
  const auto found = std::find(root.names.begin(), root.names.end(), "tok_emb.weight");
  if (found == root.names.end()) return;  // frozen (a LoRA base): in the root's companion
  tied_param_ = static_cast<int>(found - root.names.begin());
  auto sink = std::make_shared<detail::TiedGradientSink>();
  tied_sink_ = sink;
  sink->head.buffer = [this] { return tied_head_buffer(); };
  sink->head.take = [this](const at::Tensor& grad) { reduce_tied_head(grad); };
  sink->lookup = [this](const at::Tensor& ids, const at::Tensor& rows) {
    tied_lookups_.push_back({ids, rows});
  };
  model_->set_tied_gradient_sink(std::move(sink));
}

at::Tensor FullyShardedDataParallel::tied_head_buffer() {
  // The chunks accumulate in fp32: a reduction in another dtype copies instead.
  if (options_.mixed_precision_.reduce_dtype_ != at::kFloat) return at::Tensor();
  const Unit& root = *units_.back();
  const at::Tensor& weight = root.params[tied_param_];
  tied_flat_ = at::zeros({root.padded}, root.grad_shard.options().dtype(at::kFloat));
  return tied_flat_.narrow(0, root.offsets[tied_param_], weight.numel()).view(weight.sizes());
}

void FullyShardedDataParallel::reduce_tied_head(const at::Tensor& grad) {
  Unit& root = *units_.back();
  const int64_t offset = root.offsets[tied_param_];
  // The root's flat layout with only the embedding's elements: each rank receives its shard.
  // The chunked loss accumulated into tied_head_buffer's; the whole logits' .grad is copied.
  at::Tensor flat;
  if (tied_flat_.defined() &&
      grad.data_ptr() == static_cast<const void*>(tied_flat_.data_ptr<float>() + offset)) {
    flat = std::move(tied_flat_);
    tied_flat_ = at::Tensor();
  } else {
    flat = at::zeros({root.padded}, grad.options().dtype(options_.mixed_precision_.reduce_dtype_));
    flat.narrow(0, offset, grad.numel()).copy_(grad.reshape({-1}));
  }
  // In place, into this rank's slice of the flat buffer, which lives until the reduction is
  // added into the shard: no second buffer beside it.
  Unit::PendingReduce pending;
  pending.output = flat.narrow(0, root.groups->shard_rank * root.shard_numel, root.shard_numel);
  pending.scatter = root.groups->shard->reduce_scatter(flat, pending.output, ReduceOp::kAvg);
  pace_reduction(pending.scatter, root.padded);
  root.pending.push_back(std::move(pending));
}

void FullyShardedDataParallel::reduce_root_with_tied_rows(Unit& root) {
  const at::ScalarType dtype = options_.mixed_precision_.reduce_dtype_;
  const auto options = root.grad_shard.options().dtype(dtype);
  // An unchunked loss (train.chunked_loss off) left the head's part in .grad.
  at::Tensor& head = root.params[tied_param_].mutable_grad();
  if (head.defined()) {
    const at::Tensor whole = head;
    head = at::Tensor();
    reduce_tied_head(whole);
  }
  // The root's other parameters (position embedding, final norm): one all-reduce of their
  // gradients, in the unit's order, zeros where there is none.
  ProcessGroup& group = *root.groups->shard;
  int64_t others = 0;
  for (size_t k = 0; k < root.params.size(); ++k) {
    if (static_cast<int>(k) != tied_param_) others += root.params[k].numel();
  }
  at::Tensor rest = at::zeros({others}, options);
  int64_t at = 0;
  for (size_t k = 0; k < root.params.size(); ++k) {
    if (static_cast<int>(k) == tied_param_) continue;
    at::Tensor& grad = root.params[k].mutable_grad();
    if (grad.defined()) rest.narrow(0, at, grad.numel()).copy_(grad.reshape({-1}));
    grad = at::Tensor();
    at += root.params[k].numel();
  }
  WorkHandle rest_work = others > 0 ? group.all_reduce(rest, ReduceOp::kAvg) : nullptr;

  // The lookups' rows from every rank, padded to the most any rank has (id -1 adds nothing).
  const int64_t width = root.params[tied_param_].size(1);
  const auto long_options = options.dtype(at::kLong);  // on the gradients' device, as for NCCL
  at::Tensor ids = at::empty({0}, long_options), rows = at::empty({0, width}, options);
  if (!tied_lookups_.empty()) {
    std::vector<at::Tensor> all_ids, all_rows;
    for (const TiedLookup& lookup : tied_lookups_) {
      all_ids.push_back(lookup.ids.to(long_options));
      all_rows.push_back(lookup.rows.to(dtype));
    }
    ids = at::cat(all_ids);
    rows = at::cat(all_rows);
    tied_lookups_.clear();
  }
  const int size = group.size();
  at::Tensor counts = at::empty({size}, long_options);
  group.all_gather(at::full({1}, ids.numel(), long_options), counts)->wait();
  const int64_t most = counts.max().item<int64_t>();
  at::Tensor padded_ids = at::full({most}, -1, long_options);
  at::Tensor padded_rows = at::zeros({most, width}, options);
  padded_ids.narrow(0, 0, ids.numel()).copy_(ids);
  padded_rows.narrow(0, 0, ids.numel()).copy_(rows);
  at::Tensor every_id = at::empty({most * size}, long_options);
  at::Tensor every_row = at::empty({most * size * width}, options);
  WorkHandle ids_work = group.all_gather(padded_ids, every_id);
  WorkHandle rows_work = group.all_gather(padded_rows.reshape({-1}), every_row);

  // Into this rank's shard of the root's flat gradient, [begin, begin + shard_numel).
  at::Tensor extra = at::zeros({root.shard_numel}, options);
  const int64_t begin = static_cast<int64_t>(root.groups->shard_rank) * root.shard_numel;
  const int64_t end = begin + root.shard_numel;
  if (rest_work) rest_work->wait();
  at = 0;
  for (size_t k = 0; k < root.params.size(); ++k) {
    if (static_cast<int>(k) == tied_param_) continue;
    const int64_t first = root.offsets[k], n = root.params[k].numel();
    const int64_t lo = std::max(begin, first), hi = std::min(end, first + n);
    if (lo < hi)
      extra.narrow(0, lo - begin, hi - lo).add_(rest.narrow(0, at + lo - first, hi - lo));
    at += n;
  }
  ids_work->wait();
  rows_work->wait();
  // The embedding's rows this shard touches, [row_lo, row_hi): each id's rows summed over every
  // rank's lookups, then averaged as the reduce-scatter averages.
  const int64_t first = root.offsets[tied_param_];
  const int64_t lo = std::max(begin, first);
  const int64_t hi = std::min(end, first + root.params[tied_param_].numel());
  if (lo < hi) {
    const int64_t row_lo = (lo - first) / width, row_hi = (hi - first + width - 1) / width;
    const at::Tensor keep = (every_id >= row_lo) & (every_id < row_hi);
    at::Tensor block = at::zeros({row_hi - row_lo, width}, options);
    block.index_add_(0, every_id.masked_select(keep) - row_lo,
                     every_row.view({-1, width}).index({keep}));
    block.div_(size);
    extra.narrow(0, lo - begin, hi - lo)
        .add_(block.view({-1}).narrow(0, lo - (first + row_lo * width), hi - lo));
  }
  Unit::PendingReduce pending;
  pending.output = extra;
  root.pending.push_back(std::move(pending));
}

}  // namespace shardtrain
