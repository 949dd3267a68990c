// The trainer under pipeline parallelism: the step through the schedule and the checkpoint's
// tensors.
#include <optional>

#include "model/names.h"
#include "parallel/pipeline/pipeline_runner.h"
#include "parallel/tensor/tp_state.h"
#include "shardtrain/sharded_checkpoint.h"
#include "shardtrain/train.h"
#include "train/run_setup.h"

namespace shardtrain {
namespace {

// The last stage's copy of a tied token embedding, or its optimizer state: the first stage's
// copy is written for both.
bool is_tied_copy(const Transformer& model, const std::string& tensor) {
  const std::string prefix = "optim.";
  const bool state = tensor.rfind(prefix, 0) == 0;
  const std::string parameter =
      state ? tensor.substr(prefix.size(), tensor.rfind('.') - prefix.size()) : tensor;
  return detail::is_tied_head_copy(*model, parameter);
}

}  // namespace

double Trainer::pipeline_step() {
  std::optional<DistributedDataParallel::NoSync> local_only;
  if (ddp_) local_only.emplace(*ddp_);  // one all-reduce when every micro-batch is done
  // Under FSDP/ZeRO the stage is gathered for the step and reduced once, at its end.
  detail::GatheredStage gathered(fsdp_.get());
  detail::PipelineStepInputs inputs;
  inputs.batch = config_.micro_batch;
  inputs.tokens = [this](int micro_batch) {
    return loader_->micro_batch(samples_, micro_batch).inputs;
  };
  inputs.layout = [this](int micro_batch) {
    return loader_->micro_batch(samples_, micro_batch).layout;
  };
  inputs.loss = [this](const at::Tensor& logits, int micro_batch) {
    return detail::logits_loss(model_, logits, loader_->micro_batch(samples_, micro_batch));
  };
  // As without a pipeline: each micro-batch's loss is a mean, or its share of the global batch's
  // loss tokens (Batch::loss_divisor), so that 1/grad_accum of each makes the step's.
  inputs.loss_factor = scaler_.scale() / static_cast<double>(config_.grad_accum);
  inputs.bf16_autocast = config_.autocast == "bf16";
  const double loss_sum = pipeline_->step(inputs, config_.seq_len);
  local_only.reset();
  if (fsdp_) {
    // The tied copies' whole gradients are averaged and summed before the reduction, which
    // leaves each rank only its shard (the two stages' shards do not line up); the reduction
    // then averages values equal on every rank, in any order the same bits on both stages.
    pipeline_->sum_tied_gradients(&mesh_->dp());
    gathered.reduce_gradients();
    return loss_sum;
  }
  // Averaged over the data-parallel ranks first: the two copies' averages are then added in
  // one addition, which commutes, so both copies get the same bits (summed first, each
  // stage's all-reduce would add in its own order).
  if (ddp_) ddp_->all_reduce_gradients();
  pipeline_->sum_tied_gradients();
  return loss_sum;
}

void Trainer::pipeline_specs(std::vector<TensorSpec>& specs, bool has_state) const {
  const auto shapes = config_.model.parameter_shapes();
  for (const auto& shape : shapes) specs.push_back({shape.name, shape.shape, at::kFloat});
  if (!has_state) return;
  for (const auto& shape : shapes) {
    specs.push_back({"optim." + shape.name + ".exp_avg", shape.shape, at::kFloat});
    specs.push_back({"optim." + shape.name + ".exp_avg_sq", shape.shape, at::kFloat});
    specs.push_back({"optim." + shape.name + ".step", {}, at::kLong});
  }
}

void Trainer::pipeline_slices(std::vector<TensorSpec>& specs, std::vector<FlatSlice>& slices) {
  // AdamW's state once a step has been taken (the same on every rank).
  pipeline_specs(specs, detail::on_any_rank(*world_, !optimizer_->state().empty()));
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
