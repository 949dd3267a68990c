// What needs the whole of a split model: its parameters gathered, and the global gradient norm.
#include <cmath>

#include "model/expert_split.h"
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
  const auto experts = model->expert_split();
  if (!tp && !pipeline && !experts) return clip_grad_norm(model->parameters(), max_norm);
  // Squares of [split parameters' slices, replicated ones], of everything but the experts and
  // of the experts: only split ones differ across the tensor-parallel group, and experts differ
  // across the expert-parallel group.
  at::Tensor squares = at::zeros({2, 2}, at::kDouble);
  std::vector<at::Tensor> grads;
  for (const auto& item : model->named_parameters()) {
    const at::Tensor& grad = item.value().grad();
    if (!grad.defined()) continue;
    grads.push_back(grad);
    if (detail::is_tied_head_copy(*model, item.key())) continue;
    const int64_t split = tp && tp->layout_of(item.key()) ? 0 : 1;
    const int64_t expert = experts && item.key().find(".moe.experts.") != std::string::npos;
    squares[expert][split] += grad.to(at::kDouble).pow(2).sum();
  }
  if (experts) {
    at::Tensor expert_squares = squares[1].clone();
    experts->sum_across(expert_squares);
    squares[1].copy_(expert_squares);
  }
  const at::Tensor by_kind = squares.sum(0);  // [split, replicated]
  double stage = by_kind[1].item<double>();   // this pipeline stage's squares, the same across tp
  if (tp) {
    at::Tensor total = by_kind[0].clone();
    tp->group->all_reduce(total)->wait();
    stage += total.item<double>();
  } else {
    stage += by_kind[0].item<double>();
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
