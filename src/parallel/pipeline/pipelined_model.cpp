#include "parallel/pipeline/pipelined_model.h"

#include "parallel/context/context_batch.h"

namespace shardtrain {

PipelinedModel::PipelinedModel(std::unique_ptr<ParallelModel> stage,
                               std::unique_ptr<detail::PipelineRunner> runner, ProcessGroup& stages,
                               std::shared_ptr<ProcessGroup> world, Transformer model,
                               std::string description)
    : ParallelModel(std::move(model), std::move(world), std::move(description)),
      stage_(std::move(stage)),
      runner_(std::move(runner)),
      stages_(stages) {}

PipelinedModel::~PipelinedModel() = default;

double PipelinedModel::forward_backward(const StepInputs& step) {
  // DDP holds its all-reduce until every micro-batch is done; under FSDP/ZeRO the stage is
  // gathered for the step and reduced once, at its end.
  std::unique_ptr<StageScope> held = stage_->hold_stage();
  // Under context parallelism every stage runs on this rank's chunks of the sequences.
  const detail::ContextActive context(model_);
  auto micro_batch = [this, &step](int a) {
    return detail::context_part(model_, step.micro_batch(a));
  };
  detail::PipelineStepInputs inputs;
  inputs.batch = step.rows;
  inputs.tokens = [micro_batch](int a) { return micro_batch(a).inputs; };
  inputs.layout = [micro_batch](int a) { return micro_batch(a).layout; };
  inputs.logits = !step.loss_chunk;
  inputs.loss = [this, micro_batch, &step](const at::Tensor& output, int a) {
    return last_stage_loss(output, micro_batch(a), step.loss_chunk);
  };
  // As without a pipeline: each micro-batch's loss is a mean, or its share of the global batch's
  // loss tokens (Batch::loss_divisor), so that 1/micro_batches of each makes the step's.
  inputs.loss_factor = step.loss_scale / static_cast<double>(step.micro_batches);
  inputs.bf16_autocast = step.bf16_autocast;
  const double loss_sum = runner_->step(inputs, detail::context_length(model_, step.length));
  held->reduce([this](ProcessGroup* average_first) { runner_->sum_tied_gradients(average_first); });
  // The losses are on the last stage's ranks: the mean over the world is 1/pp of theirs.
  return world_mean(loss_sum) * static_cast<double>(stages_.size());
}

CheckpointContents PipelinedModel::checkpoint_contents(const torch::optim::AdamW& optimizer) {
  CheckpointContents out = stage_->checkpoint_contents(optimizer);
  bool has_state = false;
  for (const auto& spec : out.specs) has_state = has_state || spec.name.rfind("optim.", 0) == 0;
  // AdamW's state once a step has been taken (the same on every rank).
  has_state = detail::on_any_rank(*world_, has_state);
  out.specs.clear();
  const auto shapes = model_->config().parameter_shapes();
  for (const auto& shape : shapes) out.specs.push_back({shape.name, shape.shape, at::kFloat});
  if (!has_state) return out;
  for (const auto& shape : shapes) detail::add_adam_specs(out.specs, shape.name, shape.shape);
  return out;
}

at::Tensor PipelinedModel::logits(const at::Tensor& tokens, const SequenceLayout& layout) {
  return runner_->forward(tokens, layout);
}

at::Tensor PipelinedModel::batch_loss(const Batch& whole, std::optional<int64_t> chunk) {
  const detail::ContextScope context(model_, whole);
  const Batch& batch = context.batch();
  // Only the last stage's ranks have an output; the others return no tensor.
  const at::Tensor output = runner_->forward(batch.inputs, batch.layout, /*with_head=*/!chunk);
  return output.defined() ? last_stage_loss(output, batch, chunk) : output;
}

at::Tensor PipelinedModel::last_stage_loss(const at::Tensor& output, const Batch& batch,
                                           std::optional<int64_t> chunk) {
  if (!chunk) return loss(output, batch);
  return model_->head_loss(output, LossTargets{batch.targets, batch.loss_divisor, *chunk});
}

double PipelinedModel::eval_total(double local_total) {
  // On the last stage's ranks only (the same number on each).
  return world_mean(local_total) * static_cast<double>(stages_.size());
}

void PipelinedModel::share_sampled(at::Tensor& token) {
  stages_.broadcast(token, runner_->last_stage_rank())->wait();
  ParallelModel::share_sampled(token);
}

bool PipelinedModel::finite_everywhere(bool local) { return !detail::on_any_rank(*world_, !local); }

void PipelinedModel::add_metrics(nlohmann::json& line) const {
  stage_->add_metrics(line);
  // When this rank's forwards and backwards ran within the step: its share of the bubble.
  const PipelineTimeline& timeline = runner_->last_timeline();
  line["pipeline"] = {{"stage_rank", stages_.rank()},
                      {"busy_s", timeline.step_seconds * (1.0 - timeline.idle_fraction())},
                      {"span_s", timeline.step_seconds},
                      {"idle_fraction", timeline.idle_fraction()}};
}

}  // namespace shardtrain
