// What needs the whole of a split model: its parameters gathered, and the global gradient norm.
#include <cmath>

#include "model/names.h"
#include "parallel/tensor/tp_state.h"
#include "shardtrain/optim.h"
#include "shardtrain/tensor_parallel.h"

namespace shardtrain {

std::vector<std::pair<std::string, at::Tensor>> whole_parameters(Transformer& model) {
  at::NoGradGuard no_grad;
  const auto& tp = detail::tp_state(model);
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : model->named_parameters()) {
    const at::Tensor local = item.value().detach().to(at::kCPU).contiguous();
    const detail::TpLayout* layout = tp ? tp->layout_of(item.key()) : nullptr;
    if (!layout) {
      out.emplace_back(item.key(), local.clone());
      continue;
    }
    const int size = tp->size();
    at::Tensor gathered = at::empty({local.numel() * size}, local.options());
    tp->group->all_gather(local.view({-1}), gathered)->wait();
    at::Tensor whole = at::empty(layout->whole_shape, local.options());
    const at::Tensor flat = whole.view({-1});
    for (int rank = 0; rank < size; ++rank) {
      const at::Tensor piece = gathered.narrow(0, rank * local.numel(), local.numel());
      for (const auto& [at_local, at_whole, length] : layout->runs(rank, size)) {
        flat.narrow(0, at_whole, length).copy_(piece.narrow(0, at_local, length));
      }
    }
    out.emplace_back(item.key(), whole);
  }
  return out;
}

double clip_grad_norm(Transformer& model, double max_norm, ProcessGroup* pipeline) {
  const auto& tp = detail::tp_state(model);
  if (!tp && !pipeline) return clip_grad_norm(model->parameters(), max_norm);
  // [squares of split parameters' slices, squares of replicated ones]: only the first differs
  // across the group.
  double split = 0.0, replicated = 0.0;
  std::vector<at::Tensor> grads;
  for (const auto& item : model->named_parameters()) {
    const at::Tensor& grad = item.value().grad();
    if (!grad.defined()) continue;
    grads.push_back(grad);
    if (detail::is_tied_head_copy(*model, item.key())) continue;
    const double squares = grad.to(at::kDouble).pow(2).sum().item<double>();
    (tp && tp->layout_of(item.key()) ? split : replicated) += squares;
  }
  double stage = replicated;  // this pipeline stage's squares, the same across the group
  if (tp) {
    at::Tensor total = at::tensor(split, at::kDouble);
    tp->group->all_reduce(total)->wait();
    stage += total.item<double>();
  }
  if (pipeline) {
    at::Tensor total = at::tensor(stage, at::kDouble);
    pipeline->all_reduce(total)->wait();
    stage = total.item<double>();
  }
  const double norm = std::sqrt(stage);
  if (max_norm > 0 && norm > max_norm) {
    const double factor = max_norm / (norm + 1e-6);  // PyTorch's epsilon, as clip_grad_norm
    for (auto& grad : grads) grad.mul_(factor);
  }
  return norm;
}

}  // namespace shardtrain
