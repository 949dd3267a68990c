// The trainer under pipeline parallelism: the step through the schedule, the gradient norm over
// every stage, forward-only passes for evaluation and sampling, and the checkpoint's tensors.
#include <cmath>
#include <optional>

#include "model/autocast.h"
#include "parallel/pipeline/pipeline_runner.h"
#include "parallel/tensor/tp_state.h"
#include "shardtrain/sharded_checkpoint.h"
#include "shardtrain/train.h"
#include "train/run_setup.h"

namespace shardtrain {
namespace {

// The last stage's copy of a tied token embedding (the head's weight): the first stage's copy
// stands for both in the gradient norm and in checkpoints.
bool is_tied_copy(const Transformer& model, const std::string& name) {
  return model->config().tie_embeddings && !model->parts().embedding &&
         (name == "tok_emb.weight" || name.rfind("optim.tok_emb.weight.", 0) == 0);
}

}  // namespace

double Trainer::pipeline_step() {
  std::optional<DistributedDataParallel::NoSync> local_only;
  if (ddp_) local_only.emplace(*ddp_);  // one all-reduce when every micro-batch is done
  detail::PipelineStepInputs inputs;
  inputs.batch = config_.micro_batch;
  inputs.tokens = [this](int micro_batch) {
    return loader_->micro_batch(samples_, micro_batch).inputs;
  };
  inputs.loss = [this](const at::Tensor& logits, int micro_batch) {
    return detail::logits_loss(model_, logits, loader_->micro_batch(samples_, micro_batch));
  };
  // Every micro-batch has the same number of tokens, as without a pipeline.
  inputs.loss_factor = scaler_.scale() / static_cast<double>(config_.grad_accum);
  inputs.bf16_autocast = config_.autocast == "bf16";
  const double loss_sum = pipeline_->step(inputs, config_.seq_len);
  local_only.reset();
  // Averaged over the data-parallel ranks first: the two copies' averages are then added in
  // one addition, which commutes, so both copies get the same bits (summed first, each
  // stage's all-reduce would add in its own order).
  if (ddp_) ddp_->all_reduce_gradients();
  pipeline_->sum_tied_gradients();
  return loss_sum;
}

double Trainer::pipeline_clip_grad_norm() {
  const auto& tp = model_->tensor_parallel();
  // Each stage's squares (a replicated tensor counted on one rank of its tensor-parallel group,
  // the tied embedding on the first stage), summed over the pipeline and the group.
  double squares = 0.0;
  std::vector<at::Tensor> grads;
  for (const auto& item : model_->named_parameters()) {
    const at::Tensor& grad = item.value().grad();
    if (!grad.defined()) continue;
    grads.push_back(grad);
    if (is_tied_copy(model_, item.key())) continue;
    if (tp && !tp->layout_of(item.key()) && tp->rank() != 0) continue;
    squares += grad.to(at::kDouble).pow(2).sum().item<double>();
  }
  at::Tensor total = at::tensor(squares, at::kDouble);
  mesh_->group(MeshAxis::kPp).all_reduce(total)->wait();
  if (tp) tp->group->all_reduce(total)->wait();
  const double norm = std::sqrt(total.item<double>());
  if (config_.clip > 0 && norm > config_.clip) {
    const double factor = config_.clip / (norm + 1e-6);  // as clip_grad_norm
    for (auto& grad : grads) grad.mul_(factor);
  }
  return norm;
}

at::Tensor Trainer::pipeline_logits(const at::Tensor& tokens) { return pipeline_->forward(tokens); }

void Trainer::pipeline_slices(std::vector<TensorSpec>& specs, std::vector<FlatSlice>& slices) {
  // The whole model's tensors, as every rank must list them: the parameters, then AdamW's
  // state of each once a step has been taken (the same on every rank).
  bool has_state = !optimizer_->state().empty();
  at::Tensor any = at::tensor(has_state ? 1.0 : 0.0, at::kDouble);
  world_->all_reduce(any, ReduceOp::kMax)->wait();
  has_state = any.item<double>() > 0;
  const auto shapes = config_.model.parameter_shapes();
  for (const auto& shape : shapes) specs.push_back({shape.name, shape.shape, at::kFloat});
  if (has_state) {
    for (const auto& shape : shapes) {
      specs.push_back({"optim." + shape.name + ".exp_avg", shape.shape, at::kFloat});
      specs.push_back({"optim." + shape.name + ".exp_avg_sq", shape.shape, at::kFloat});
      specs.push_back({"optim." + shape.name + ".step", {}, at::kLong});
    }
  }
  // This stage's tensors, shared out among the ranks that hold them (its data-parallel and
  // tensor-parallel ranks), as without a pipeline.
  NamedTensors mine;
  for (auto& [name, tensor] : detail::logical_tensors(model_, *optimizer_)) {
    if (!is_tied_copy(model_, name)) mine.emplace_back(name, tensor);
  }
  const int holders = world_size() / static_cast<int>(config_.pp);
  slices = detail::owned_slices(config_.strategy, rank() % holders, holders,
                                model_->tensor_parallel().get(), dp_rank(), dp_size(), mine);
}

}  // namespace shardtrain
