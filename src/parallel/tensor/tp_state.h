// What a model cut by tensor parallelism keeps: the group, whether sequence parallelism is on,
// and how each of its parameters maps onto the whole tensor it is a slice of.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/layer_split.h"
#include "shardtrain/dist.h"
#include "shardtrain/model.h"
#include "shardtrain/sharded_checkpoint.h"

namespace shardtrain::detail {

// How one parameter is cut across the tensor-parallel ranks: along `dim` (0: rows, the output
// features of a column-parallel linear layer or the vocabulary of an embedding; 1: columns, the
// input features of a row-parallel one), with `parts` fused blocks along dim 0 each cut on its
// own (GPT-2's qkv holds q, k and v: rank r keeps its heads of each).
struct TpLayout {
  int dim = 0;
  int parts = 1;
  std::vector<int64_t> whole_shape;

  std::vector<int64_t> local_shape(int size) const;
  // (local flat offset, whole flat offset, length) runs that cover rank `rank`'s local tensor
  // in order: one per fused part along dim 0, one per row along dim 1.
  std::vector<std::array<int64_t, 3>> runs(int rank, int size) const;
};

// The model's layers' LayerSplit under tensor parallelism: Megatron's f and g as collectives on
// `group` (tensor_parallel.h), with sequence_parallel from parallel.sequence_parallel.
struct TpState : LayerSplit, std::enable_shared_from_this<TpState> {
  std::shared_ptr<ProcessGroup> group;
  // Parameters cut across the group, by their name in the model. Every other parameter is
  // replicated: the same values on every rank of the group.
  std::map<std::string, TpLayout> layouts;

  int size() const override { return group->size(); }
  int rank() const override { return group->rank(); }
  at::Tensor copy_in(const at::Tensor& x) const override;
  at::Tensor reduce_out(const at::Tensor& x) const override;
  at::Tensor gather_sequence(const at::Tensor& x) const override;
  at::Tensor reduce_scatter_sequence(const at::Tensor& x) const override;
  void max_across(at::Tensor& x) const override;
  void sum_across(at::Tensor& x) const override;
  ParameterInitializer split_initializer(ParameterInitializer init) const override;
  // The layout of a parameter or of optimizer state named after it ("optim.NAME.exp_avg"),
  // or null for a replicated one.
  const TpLayout* layout_of(const std::string& tensor_name) const;
};

// A flat range [offset, offset + numel) of a local tensor, as ranges of the whole tensor:
// (local offset, whole offset, length) in local order.
std::vector<std::array<int64_t, 3>> whole_ranges(const TpLayout& layout, int rank, int size,
                                                 int64_t offset, int64_t numel);

// The model's tensor-parallel state: its LayerSplit, set by parallelize_module (null when the
// model is not split).
std::shared_ptr<TpState> tp_state(const Transformer& model);

// `init` (which fills ranges of whole parameters) as the initializer of a split model: a range
// of a split parameter is filled from the matching ranges of the whole one.
ParameterInitializer tensor_parallel_initializer(std::shared_ptr<const TpState> state,
                                                 ParameterInitializer init);

// Checkpoints hold whole tensors whatever the split. `tp` may be null (nothing is split).
// The whole shape of the tensor named `name`, held here at `local`.
std::vector<int64_t> whole_shape(const TpState* tp, const std::string& name, at::IntArrayRef local);
// A slice of a local tensor as slices of the whole one (itself when it is not split).
std::vector<FlatSlice> whole_slices(const TpState* tp, const FlatSlice& local);
// Fills `out` (1-D) with elements [offset, offset + out.numel()) of the local tensor `name`.
void read_local_into(const ShardedCheckpointReader& reader, const TpState* tp,
                     const std::string& name, int64_t offset, at::Tensor out);

}  // namespace shardtrain::detail
