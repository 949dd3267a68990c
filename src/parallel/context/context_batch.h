// Context parallelism's compute side: the part of a batch a rank of the cp group takes.
#pragma once

#include <memory>

#include "model/context_split.h"
#include "shardtrain/data.h"
#include "shardtrain/model.h"

namespace shardtrain::detail {

// This rank's chunks of `whole` for a model whose sequences are split (`whole` itself
// otherwise): the columns context_positions names of the inputs, targets and layout, the loss
// divisor a cp-th of the whole's, so that the loss summed over the group's ranks is the whole
// sequences' (the data-parallel step, over dp_shard x cp, averages it).
Batch context_part(const Transformer& model, const Batch& whole);
// Tokens per sequence this rank holds of sequences of `length`.
int64_t context_length(const Transformer& model, int64_t length);

// While held, the model's sequences are split: its ContextSplit is active (a no-op without one).
class ContextActive {
 public:
  explicit ContextActive(const Transformer& model);
  ~ContextActive();
  ContextActive(const ContextActive&) = delete;
  ContextActive& operator=(const ContextActive&) = delete;

 private:
  ContextSplit* split_ = nullptr;
};

// Both for one batch: while held, the split is active and batch() is this rank's part of
// `whole`, which must outlive the scope.
class ContextScope {
 public:
  ContextScope(const Transformer& model, const Batch& whole)
      : active_(model), local_(context_part(model, whole)) {}
  const Batch& batch() const { return local_; }

 private:
  ContextActive active_;
  Batch local_;
};

}  // namespace shardtrain::detail
