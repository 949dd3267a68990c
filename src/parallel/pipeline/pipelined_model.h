// Pipeline parallelism's ParallelModel: this rank's stages run by the schedule's runner, around
// the stage's own data-parallel strategy (replicated or sharded), which it drives through
// ParallelModel's stage parts.
#pragma once

#include <memory>

#include "parallel/parallel_model.h"
#include "parallel/pipeline/pipeline_runner.h"

namespace shardtrain {

class PipelinedModel : public ParallelModel {
 public:
  // `stage`: the stage's strategy over the same model; `stages`: the mesh's pp axis, on which
  // `runner` runs.
  PipelinedModel(std::unique_ptr<ParallelModel> stage,
                 std::unique_ptr<detail::PipelineRunner> runner, ProcessGroup& stages,
                 std::shared_ptr<ProcessGroup> world, Transformer model, std::string description);
  ~PipelinedModel() override;

  // The schedule's forwards and backwards; the losses are on the last stage's ranks.
  double forward_backward(const StepInputs& step) override;
  std::vector<OptimizedTensor> optimized() const override { return stage_->optimized(); }
  void zero_grad(torch::optim::Optimizer& optimizer) override { stage_->zero_grad(optimizer); }
  void optimizer_step(torch::optim::AdamW& optimizer, double lr) override {
    stage_->optimizer_step(optimizer, lr);
  }
  // The whole model's tensors listed on every stage; this stage's written by its ranks.
  CheckpointContents checkpoint_contents(const torch::optim::AdamW& optimizer) override;
  void after_save() override { stage_->after_save(); }
  void restore(const ShardedCheckpointReader& reader, torch::optim::AdamW& optimizer) override {
    stage_->restore(reader, optimizer);
  }
  bool holds_whole_model() const override { return false; }
  std::unique_ptr<StageScope> inference_scope() override { return stage_->hold_stage(); }
  at::Tensor logits(const at::Tensor& tokens, const SequenceLayout& layout) override;
  at::Tensor batch_loss(const Batch& batch, std::optional<int64_t> chunk) override;
  double eval_total(double local_total) override;
  // From the last stage's rank to the others of the pipeline.
  void share_sampled(at::Tensor& token) override;
  bool forward_is_collective() const override { return true; }
  // The stage's fields, and when this rank's forwards and backwards ran within the step.
  void add_metrics(nlohmann::json& line) const override;
  std::string progress_note() const override { return stage_->progress_note(); }
  std::unique_ptr<StageScope> hold_stage() override { return stage_->hold_stage(); }
  double clip_grad_norm(double max_norm, ProcessGroup* /*stages*/) override {
    return stage_->clip_grad_norm(max_norm, &stages_);
  }
  bool unscale_gradients(const LossScaler& scaler) override {
    return stage_->unscale_gradients(scaler);
  }
  // Each rank checked its own stages: every rank of the world agrees.
  bool finite_everywhere(bool local) override;

 private:
  // The last stage's loss of a micro-batch, in training and evaluation: over chunks of `chunk`
  // tokens of the head's logits from the last block's output, or of the whole logits.
  at::Tensor last_stage_loss(const at::Tensor& output, const Batch& batch,
                             std::optional<int64_t> chunk);

  std::unique_ptr<ParallelModel> stage_;
  std::unique_ptr<detail::PipelineRunner> runner_;
  ProcessGroup& stages_;
};

}  // namespace shardtrain
