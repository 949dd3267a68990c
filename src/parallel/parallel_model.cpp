#include "parallel/parallel_model.h"

#include <sstream>

#include "model/autocast.h"
#include "parallel/context/context_batch.h"
#include "parallel/expert/expert_parallel.h"
#include "parallel/tensor/tp_state.h"
#include "shardtrain/tensor_parallel.h"
#include "trace/telemetry.h"

namespace shardtrain {

at::Tensor detail::logits_loss(Transformer& model, const at::Tensor& logits, const Batch& batch) {
  const at::Tensor flat = logits.reshape({-1, logits.size(-1)}).to(at::kFloat);
  const at::Tensor targets = batch.targets.reshape({-1});
  // Split over the vocabulary: the loss is reduced across the group, never gathered.
  if (const auto& tp = detail::tp_state(model)) {
    return vocab_parallel_cross_entropy(flat, targets, *tp->group, batch.loss_divisor);
  }
  if (batch.loss_divisor <= 0) return at::cross_entropy_loss(flat, targets);
  // A sum over the tokens that carry a loss, divided by the global batch's share: every micro-
  // batch then weighs by its loss tokens, and the step's loss is the mean over all of them.
  return at::cross_entropy_loss(flat, targets, /*weight=*/{}, at::Reduction::Sum, kIgnoreIndex) /
         batch.loss_divisor;
}

bool detail::on_any_rank(ProcessGroup& group, bool value) {
  at::Tensor any = at::tensor(value ? 1.0 : 0.0, at::kDouble);
  group.all_reduce(any, ReduceOp::kMax)->wait();
  return any.item<double>() > 0;
}

const torch::optim::AdamWParamState* detail::adam_state(const torch::optim::AdamW& optimizer,
                                                        const at::Tensor& parameter) {
  auto it = optimizer.state().find(optimizer_state_key(parameter));
  if (it == optimizer.state().end()) return nullptr;
  return static_cast<const torch::optim::AdamWParamState*>(it->second.get());
}

void detail::add_adam_specs(std::vector<TensorSpec>& specs, const std::string& name,
                            const std::vector<int64_t>& shape) {
  const std::string prefix = "optim." + name;
  specs.push_back({prefix + ".exp_avg", shape, at::kFloat});
  specs.push_back({prefix + ".exp_avg_sq", shape, at::kFloat});
  specs.push_back({prefix + ".step", {}, at::kLong});
}

std::vector<std::pair<std::string, at::Tensor>> detail::trained_parameters(Transformer& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : model->named_parameters()) {
    if (item.value().requires_grad()) out.emplace_back(item.key(), item.value());
  }
  return out;
}

ParallelModel::ParallelModel(Transformer model, std::shared_ptr<ProcessGroup> world,
                             std::string description)
    : model_(std::move(model)), world_(std::move(world)), description_(std::move(description)) {}

ParallelModel::~ParallelModel() = default;

double ParallelModel::forward_backward(const StepInputs& step) {
  // The micro-batches' losses summed in fp64 where they are, one after another, and read back
  // once: on a GPU the next micro-batch is queued without waiting for this one's backward.
  at::Tensor loss_sum;
  for (int a = 0; a < step.micro_batches; ++a) {
    const Batch batch = step.micro_batch(a);
    at::Tensor loss;
    {
      detail::TraceSpan span("forward", "forward", {{"micro_batch", a}});
      detail::AutocastScope autocast(detail::bf16_autocast(step.bf16_autocast, step.device));
      loss = batch_loss(batch, step.loss_chunk);
    }
    detail::TraceSpan backward_span("backward", "backward", {{"micro_batch", a}});
    // Every micro-batch has the same number of tokens (or, for instruction data, its loss is
    // its sum over the global batch's mean share of loss tokens: Batch::loss_divisor), so the
    // mean over the global batch is the mean of the micro-batch losses: each contributes
    // 1/micro_batches of the gradient (and a data-parallel step averages over the ranks).
    const at::Tensor scaled = loss * (step.loss_scale / static_cast<double>(step.micro_batches));
    {
      const std::shared_ptr<void> local_only = local_backward(a, step.micro_batches);
      scaled.backward();
    }
    // A copy, so that the sum never writes into the loss.
    const at::Tensor value = loss.detach().to(at::kDouble, /*non_blocking=*/false, /*copy=*/true);
    loss_sum = loss_sum.defined() ? loss_sum.add_(value) : value;
  }
  return world_mean(loss_sum.defined() ? loss_sum.item<double>() : 0.0);
}

double ParallelModel::eval_total(double local_total) {
  // Each rank of a cp group took its chunks' share of the loss (ContextScope).
  const std::shared_ptr<detail::ContextSplit>& split = model_->context_split();
  return split && split->size() > 1 ? split->mean(local_total) : local_total;
}

ProcessGroup* ParallelModel::keep_gradients_local(bool local) {
  if (local) {
    throw std::invalid_argument(
        "this strategy reduces its gradients as part of its sharding: they cannot be left to "
        "each rank (1-bit Adam needs parallel.strategy \"ddp\")");
  }
  return nullptr;
}

double ParallelModel::world_mean(double value) const {
  // The reported loss is the global batch's, the same number on every rank.
  if (!world_ || world_->size() == 1) return value;
  at::Tensor mean = at::tensor(value, at::kDouble);
  world_->all_reduce(mean, ReduceOp::kAvg)->wait();
  return mean.item<double>();
}

std::vector<at::Tensor> ParallelModel::parameters() const {
  std::vector<at::Tensor> out;
  for (const auto& t : optimized()) out.push_back(t.tensor);
  return out;
}

NamedTensors ParallelModel::checkpoint_expected() {
  NamedTensors expected;
  const detail::TpState* tp = detail::tp_state(model_).get();
  const auto meta = at::TensorOptions(at::kFloat).device(at::kMeta);
  for (const auto& [name, value] : detail::trained_parameters(model_)) {
    expected.emplace_back(name, at::empty(detail::whole_shape(tp, name, value.sizes()), meta));
  }
  for (const auto& item : model_->named_buffers()) expected.emplace_back(item.key(), item.value());
  if (!model_->expert_split()) return expected;
  // Under expert parallelism the checkpoint holds every expert; this rank's are among them.
  std::vector<TensorSpec> specs;
  for (const auto& [name, tensor] : expected) {
    specs.push_back({name, tensor.sizes().vec(), tensor.scalar_type()});
  }
  NamedTensors every;
  for (const auto& spec : detail::with_every_expert(specs, model_->config().n_experts)) {
    every.emplace_back(spec.name, at::empty(spec.shape, meta.dtype(spec.dtype)));
  }
  return every;
}

bool ParallelModel::gradients_finite(const LossScaler& scaler) {
  return finite_everywhere(unscale_gradients(scaler));
}

at::Tensor ParallelModel::logits(const at::Tensor& tokens, const SequenceLayout& layout) {
  return model_->forward(tokens, layout);
}

at::Tensor ParallelModel::loss(const at::Tensor& logits, const Batch& batch) {
  return detail::logits_loss(model_, logits, batch);
}

at::Tensor ParallelModel::batch_loss(const Batch& whole, std::optional<int64_t> chunk) {
  const detail::ContextScope context(model_, whole);
  const Batch& batch = context.batch();
  if (!chunk) return loss(logits(batch.inputs, batch.layout), batch);
  return model_->forward_loss(batch.inputs, batch.layout,
                              LossTargets{batch.targets, batch.loss_divisor, *chunk});
}

at::Tensor ParallelModel::whole_vocabulary(const at::Tensor& logits) const {
  const at::Tensor full = logits.to(at::kFloat);
  if (const auto& tp = detail::tp_state(model_)) return gather_vocabulary(full, *tp->group);
  return full;
}

bool ParallelModel::forward_is_collective() const {
  return detail::tp_state(model_) != nullptr || model_->expert_split() != nullptr;
}

void ParallelModel::share_sampled(at::Tensor& token) {
  // The experts' outputs come from other ranks: every rank gets rank 0's draw, so that all
  // generate the same sequence and take part in the same exchanges.
  if (model_->expert_split() && world_ && world_->size() > 1) world_->broadcast(token, 0)->wait();
}

}  // namespace shardtrain
