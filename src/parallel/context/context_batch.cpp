#include "parallel/context/context_batch.h"

namespace shardtrain::detail {

ContextScope::ContextScope(const Transformer& model, const Batch& whole) : whole_(whole) {
  const std::shared_ptr<ContextSplit>& split = model->context_split();
  if (!split || split->size() == 1) return;
  split_ = split.get();
  const at::Tensor columns = context_positions(whole.inputs.size(1), split->rank(), split->size())
                                 .to(whole.inputs.device());
  auto local = [&](const at::Tensor& t) {
    return t.defined() ? t.index_select(1, columns.to(t.device())) : t;
  };
  local_.inputs = local(whole.inputs);
  local_.targets = local(whole.targets);
  local_.layout.positions = local(whole.layout.positions);
  local_.layout.segments = local(whole.layout.segments);
  local_.loss_divisor = whole.loss_divisor / split->size();
  split_->active = true;
}

ContextScope::~ContextScope() {
  if (split_) split_->active = false;
}

}  // namespace shardtrain::detail
