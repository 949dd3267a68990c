// The one object the trainer drives, whatever the parallelism: parallelize() returns it, and
// each strategy implements it in its own folder (replicated: ddp/, sharded: fsdp/ and zero/,
// the pipeline around either: pipeline/). The trainer keeps the loop, the optimizer, the
// schedules of evaluation and checkpoints, metrics and progress, and asks this object for every
// step that differs between strategies.
#pragma once

#include <torch/optim/adamw.h>

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "optim/state_key.h"
#include "shardtrain/data.h"
#include "shardtrain/dist.h"
#include "shardtrain/model.h"
#include "shardtrain/optim.h"
#include "shardtrain/sharded_checkpoint.h"

namespace shardtrain {

// One optimizer step's micro-batches, as the trainer's loader gives them.
struct StepInputs {
  std::function<Batch(int micro_batch)> micro_batch;
  int micro_batches = 1;    // train.grad_accum
  double loss_scale = 1.0;  // the loss scaler's factor (1 without scaling)
  bool bf16_autocast = false;
  at::DeviceType device = at::kCPU;  // where the model and the batches are (run.device)
  // Set: the loss over chunks of the head's logits of this many tokens (0: about 32 MiB of
  // logits each; train.chunked_loss); unset: over the whole logits. See batch_loss.
  std::optional<int64_t> loss_chunk;
  int64_t rows = 0;    // sequences per micro-batch
  int64_t length = 0;  // tokens per sequence
};

// A tensor the optimizer updates (this rank's piece of it under sharding), and whether it is a
// matrix (decayed) or a bias, norm or other 1-D tensor (not decayed).
struct OptimizedTensor {
  at::Tensor tensor;
  bool matrix = false;
};

// What this rank writes of a checkpoint: every logical tensor's spec (the same list on every
// rank) and its slices of them. `fetchers`: empty, or one per slice producing its values as the
// save writes it (null: the slice's own data), for state that is not in memory.
struct CheckpointContents {
  std::vector<TensorSpec> specs;
  std::vector<FlatSlice> slices;
  std::vector<std::function<at::Tensor()>> fetchers;
};

// A scope over a pipeline stage's schedule: the stage's data-parallel step holds its gradient
// reduction (DDP) or keeps the stage gathered (FSDP, ZeRO) until reduce(), which reduces once;
// destroyed without reduce() (evaluation, generation, a step that failed) it reduces nothing.
class StageScope {
 public:
  virtual ~StageScope() = default;
  // `sum_tied` adds the tied embedding's two copies' gradients, each first averaged over the
  // group it is given (null: not averaged first). Collective.
  virtual void reduce(const std::function<void(ProcessGroup* average_first)>& sum_tied) = 0;
};

class ParallelModel {
 public:
  // `world`: every rank of the run (null for one process without a group).
  ParallelModel(Transformer model, std::shared_ptr<ProcessGroup> world, std::string description);
  virtual ~ParallelModel();
  ParallelModel(const ParallelModel&) = delete;
  ParallelModel& operator=(const ParallelModel&) = delete;

  // The step. forward_backward: the micro-batches forward and backward, each contributing
  // 1/micro_batches of the gradient times step.loss_scale; returns the step's loss summed over
  // the micro-batches, the global batch's, the same on every rank. Collective.
  virtual double forward_backward(const StepInputs& step);
  // What the optimizer updates, in a fixed order.
  virtual std::vector<OptimizedTensor> optimized() const = 0;
  std::vector<at::Tensor> parameters() const;
  virtual void zero_grad(torch::optim::Optimizer& optimizer) = 0;
  // After a forward or backward that failed (a collective's error under replica fault
  // tolerance), before the step is taken again: forgets what the pass left in flight, so that
  // the next one starts as a first would. Not collective.
  virtual void abandon_pass() {}
  // Unscales the gradients by the scaler's factor and whether they are finite on every rank
  // that holds a piece of them (all ranks then skip a step together or not at all). Collective.
  bool gradients_finite(const LossScaler& scaler);
  // The global gradient norm before clipping to `max_norm` (0: no clipping). Collective.
  double clip_grad_norm(double max_norm) { return clip_grad_norm(max_norm, nullptr); }
  // From the next backward on, `local` leaves each rank's gradients its own instead of the
  // data-parallel average (1-bit Adam averages the momentum instead). Returns the group the
  // average was taken over (null: one data-parallel rank). The replicated strategies can; the
  // others refuse a local = true (std::invalid_argument).
  virtual ProcessGroup* keep_gradients_local(bool local);
  // AdamW's step at `lr` (already set in its groups), wherever the state lives.
  virtual void optimizer_step(torch::optim::AdamW& optimizer, double lr) = 0;

  // Checkpoints: what this rank writes (collective), after_save() once it is written, and
  // restore() reading this rank's share into the model and the optimizer (collective).
  virtual CheckpointContents checkpoint_contents(const torch::optim::AdamW& optimizer) = 0;
  virtual void after_save() {}
  virtual void restore(const ShardedCheckpointReader& reader, torch::optim::AdamW& optimizer) = 0;
  // What a checkpoint must hold for this rank's model, to compare before anything is read: the
  // trained parameters as fp32 meta tensors of their whole shapes (under FSDP/ZeRO the module's
  // tensors are views of gathered buffers, perhaps freed, perhaps bf16; under tensor
  // parallelism slices), and the buffers; under expert parallelism every expert's, of which
  // this rank holds some.
  NamedTensors checkpoint_expected();
  // False when this rank's model is some stages of the whole one.
  virtual bool holds_whole_model() const { return true; }

  // Evaluation and generation, in no_grad and eval mode. inference_scope: held while they run
  // (null: nothing to hold). logits: of the last position's stage, undefined on ranks that do
  // not hold it. loss: the mean cross-entropy of a batch's logits (never gathered across a
  // tensor-parallel group). eval_total: the evaluation's loss total on every rank. share_sampled:
  // the sampled token, from the rank that drew it to the others that need it. Collective.
  virtual std::unique_ptr<StageScope> inference_scope() { return nullptr; }
  virtual at::Tensor logits(const at::Tensor& tokens, const SequenceLayout& layout);
  at::Tensor loss(const at::Tensor& logits, const Batch& batch);
  // The loss of a batch's forward, in training and evaluation: over chunks of `chunk` tokens of
  // the head's logits when set (Transformer::forward_loss), else loss(logits(...)). Undefined on
  // ranks that do not hold the last pipeline stage.
  virtual at::Tensor batch_loss(const Batch& batch, std::optional<int64_t> chunk);
  virtual double eval_total(double local_total);
  virtual void share_sampled(at::Tensor& token);
  // The last position's logits over the whole vocabulary (gathered across a tensor-parallel
  // group), fp32.
  at::Tensor whole_vocabulary(const at::Tensor& logits) const;
  // Whether every rank takes part in a forward pass (rank 0 alone may not generate).
  virtual bool forward_is_collective() const;

  // Reporting: how the run is parallelized (lines for the start of a run), this step's extra
  // metrics.jsonl fields, and what the progress line adds.
  const std::string& description() const { return description_; }
  void append_description(const std::string& lines) { description_ += lines; }
  virtual void add_metrics(nlohmann::json& /*line*/) const {}
  virtual std::string progress_note() const { return ""; }

  // The parts a pipeline runs around a stage's own strategy (PipelinedModel).
  virtual std::unique_ptr<StageScope> hold_stage() = 0;
  virtual double clip_grad_norm(double max_norm, ProcessGroup* stages) = 0;
  // This rank's own gradients: unscaled, and whether they are finite.
  virtual bool unscale_gradients(const LossScaler& scaler) = 0;
  // Whether `local` (finite here) holds on every rank that must agree. Collective.
  virtual bool finite_everywhere(bool local) { return local; }

 protected:
  // The mean of `value` over the world (itself on one process). Collective.
  double world_mean(double value) const;
  // A guard held around the backward of micro-batch `a` of `count` that keeps its gradients
  // local (DDP's no_sync before the last); null when there is none.
  virtual std::shared_ptr<void> local_backward(int /*a*/, int /*count*/) { return nullptr; }

  Transformer model_;
  std::shared_ptr<ProcessGroup> world_;

 private:
  std::string description_;
};

namespace detail {

// The mean cross-entropy of `logits` (the model's output for batch.inputs) against
// batch.targets; under tensor parallelism reduced across the group, never gathered.
at::Tensor logits_loss(Transformer& model, const at::Tensor& logits, const Batch& batch);
// Whether `value` is true on any rank of `group`. Collective.
bool on_any_rank(ProcessGroup& group, bool value);
// AdamW's state of one parameter, or null before its first step.
const torch::optim::AdamWParamState* adam_state(const torch::optim::AdamW& optimizer,
                                                const at::Tensor& parameter);
// Appends the specs of AdamW's state of parameter `name` of whole shape `shape`, as checkpoints
// hold it: "optim.NAME.exp_avg" and ".exp_avg_sq" (fp32, `shape`), ".step" (a 0-dim int64).
void add_adam_specs(std::vector<TensorSpec>& specs, const std::string& name,
                    const std::vector<int64_t>& shape);
// Parameters that train: every one, or a LoRA run's adapters (its frozen base comes from
// model.init_from or the seed again on resume, and is not written).
std::vector<std::pair<std::string, at::Tensor>> trained_parameters(Transformer& model);

}  // namespace detail
}  // namespace shardtrain
