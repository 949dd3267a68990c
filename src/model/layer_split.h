// What a layer split across ranks asks of the group it is split across. The model knows no
// parallelism: tensor parallelism (src/parallel/tensor/) implements this and hands it to the
// layers it splits (parallelize_module), which call it where Megatron-LM's f and g stand.
#pragma once

#include <ATen/ATen.h>

#include "shardtrain/model.h"

namespace shardtrain::detail {

class LayerSplit {
 public:
  virtual ~LayerSplit() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // f: the identity forward; backward, the gradient summed across the group.
  virtual at::Tensor copy_in(const at::Tensor& x) const = 0;
  // g: the sum across the group forward; backward, the identity.
  virtual at::Tensor reduce_out(const at::Tensor& x) const = 0;
  // f and g under sequence parallelism: an all-gather and a reduce-scatter along dim 1, the
  // sequence.
  virtual at::Tensor gather_sequence(const at::Tensor& x) const = 0;
  virtual at::Tensor reduce_scatter_sequence(const at::Tensor& x) const = 0;
  // In place, outside autograd: the element-wise max, or sum, across the group (the
  // vocabulary-parallel loss's softmax).
  virtual void max_across(at::Tensor& x) const = 0;
  virtual void sum_across(at::Tensor& x) const = 0;
  // `init` (which fills ranges of whole parameters) as the initializer of the split model: a
  // range of a split parameter is filled from the matching ranges of the whole one.
  virtual ParameterInitializer split_initializer(ParameterInitializer init) const = 0;

  // Sequence parallelism as configured, and whether the forward in progress runs with it: a
  // sequence the group cannot split evenly (generation's growing prompt) runs without, which
  // computes the same values.
  bool sequence_parallel = false;
  bool sequence_parallel_now = false;
};

}  // namespace shardtrain::detail
