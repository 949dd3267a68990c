// Context parallelism's compute side: the part of a batch a rank of the cp group takes.
#pragma once

#include "model/context_split.h"
#include "shardtrain/data.h"
#include "shardtrain/model.h"

namespace shardtrain::detail {

// While held, the model's sequences are split (its ContextSplit active) and batch() is this
// rank's chunks of `whole`: the columns context_positions names of the inputs, targets and
// layout, the loss divisor a cp-th of the whole's, so that the loss summed over the group's
// ranks is the whole sequences' (the data-parallel step, over dp_shard x cp, averages it). A
// model without a split: batch() is `whole`. `whole` must outlive the scope.
class ContextScope {
 public:
  ContextScope(const Transformer& model, const Batch& whole);
  ~ContextScope();
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;
  const Batch& batch() const { return split_ ? local_ : whole_; }

 private:
  ContextSplit* split_ = nullptr;
  const Batch& whole_;
  Batch local_;
};

}  // namespace shardtrain::detail
