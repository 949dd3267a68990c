#include "parallel/context/context_batch.h"

namespace shardtrain::detail {
namespace {

bool split(const Transformer& model) {
  return model->context_split() && model->context_split()->size() > 1;
}

}  // namespace

Batch context_part(const Transformer& model, const Batch& whole) {
  if (!split(model)) return whole;
  const ContextSplit& cp = *model->context_split();
  const at::Tensor columns = context_positions(whole.inputs.size(1), cp.rank(), cp.size());
  auto local = [&](const at::Tensor& t) {
    return t.defined() ? t.index_select(1, columns.to(t.device())) : t;
  };
  Batch part;
  part.inputs = local(whole.inputs);
  part.targets = local(whole.targets);
  part.layout.positions = local(whole.layout.positions);
  part.layout.segments = local(whole.layout.segments);
  part.loss_divisor = whole.loss_divisor / cp.size();
  return part;
}

int64_t context_length(const Transformer& model, int64_t length) {
  return split(model) ? length / model->context_split()->size() : length;
}

ContextActive::ContextActive(const Transformer& model) {
  if (!split(model)) return;
  split_ = model->context_split().get();
  split_->active = true;
}

ContextActive::~ContextActive() {
  if (split_) split_->active = false;
}

}  // namespace shardtrain::detail
