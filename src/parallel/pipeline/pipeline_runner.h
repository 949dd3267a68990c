// Runs a pipeline schedule on one rank: its stages' forwards and backwards in the schedule's
// order, activations and gradients sent to and received from the neighbouring stages' ranks.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "shardtrain/dist.h"
#include "shardtrain/model.h"
#include "shardtrain/pipeline.h"

namespace shardtrain::detail {

// What one training step gives the pipeline.
struct PipelineStepInputs {
  std::function<at::Tensor(int micro_batch)> tokens;  // read on the first stage's rank
  // Packed samples' positions and segments, read on every rank; unset: plain sequences.
  std::function<SequenceLayout(int micro_batch)> layout;
  // The loss of a micro-batch, on the last stage's rank, of the last stage's output: its logits,
  // or with `logits` false the last block's output (Transformer::head_loss takes the head
  // itself, over chunks of the logits).
  std::function<at::Tensor(const at::Tensor& output, int micro_batch)> loss;
  bool logits = true;
  double loss_factor = 1.0;    // each micro-batch's loss is multiplied by this for backward
  int64_t batch = 0;           // sequences per micro-batch
  bool bf16_autocast = false;  // forwards under CPU bf16 autocast (precision.autocast)
};

class PipelineRunner {
 public:
  // `model` holds this rank's stages (ModelInit::parts); `group` is the mesh's pp axis, whose
  // rank r holds stages r, r + P, ...; `blocks` are every stage's blocks. `split_backward`: run
  // the zero-bubble schedule's input and weight gradients as two passes (off under activation
  // checkpointing, whose recomputation accumulates the weights' gradients already; the input
  // gradient then does the whole backward and the weight gradient nothing).
  PipelineRunner(Transformer model, std::shared_ptr<ProcessGroup> group, PipelineSchedule schedule,
                 std::vector<std::pair<int64_t, int64_t>> blocks, bool split_backward);
  ~PipelineRunner();  // waits for nothing: a step waits for its sends before it returns

  // One step's forwards and backwards of the micro-batches of length `length`; parameter
  // gradients accumulate into .grad. Returns the sum of the micro-batches' losses on the rank
  // holding the last stage, 0 on the others.
  double step(const PipelineStepInputs& inputs, int64_t length);
  // Forward only (evaluation, generation): every rank of the group passes the same tokens;
  // returns the logits on the rank holding the last stage (without `with_head`: the last
  // block's output, for Transformer::head_loss), an undefined tensor on the others.
  at::Tensor forward(const at::Tensor& tokens, const SequenceLayout& layout = SequenceLayout(),
                     bool with_head = true);
  // With tied embeddings: adds the first and the last stage's gradients of the token embedding,
  // so that both copies take the same step. With `average_first`, each is averaged over that
  // group (the stage's data-parallel ranks) before (FSDP and ZeRO, which reduce afterwards,
  // each stage its own flat buffer in its own order, then average equal values: the same bits).
  void sum_tied_gradients(ProcessGroup* average_first = nullptr);

  bool holds_first_stage() const { return group_->rank() == 0; }
  bool holds_last_stage() const { return rank_of(schedule_.stages() - 1) == group_->rank(); }
  int last_stage_rank() const { return rank_of(schedule_.stages() - 1); }
  const PipelineSchedule& schedule() const { return schedule_; }
  const PipelineTimeline& last_timeline() const { return timeline_; }

 private:
  struct Held;
  int rank_of(int stage) const { return stage % schedule_.ranks; }
  bool split_last_stage() const {
    return split_backward_ && schedule_.kind == PipelineScheduleKind::kZeroBubble;
  }
  at::Tensor activation(int64_t batch, int64_t length) const;
  // The stage whose message `action` needs (activations from the stage before, the gradient
  // from the stage after), or -1 when it needs none.
  int sender_of(const PipelineAction& action) const;
  void post_receive(const PipelineAction& action, int64_t batch, int64_t length);
  at::Tensor take_received(const PipelineAction& action);
  void send(at::Tensor tensor, int stage, int micro_batch, bool gradient);
  // `received`: the message the action needed (activations or their gradient), if any.
  void run(const PipelineAction& action, const PipelineStepInputs& inputs, int64_t length,
           at::Tensor received, double& loss_sum);
  void backward(Held& held, bool whole, bool send_input_gradient, int stage, int micro_batch);
  void wait_sends();
  // Waits for and drops the send of stage `stage`'s output of `micro_batch` (at its backward).
  void release_sent_activation(int stage, int micro_batch);

  Transformer model_;
  std::shared_ptr<ProcessGroup> group_;
  PipelineSchedule schedule_;
  std::vector<std::pair<int64_t, int64_t>> blocks_;
  bool split_backward_;
  std::map<int, std::vector<at::Tensor>> stage_parameters_;     // the weights each stage's W steps
  std::map<std::pair<int, int>, std::unique_ptr<Held>> held_;   // (stage, micro-batch)
  std::map<int, std::pair<at::Tensor, WorkHandle>> receiving_;  // by tag
  std::map<int, std::pair<at::Tensor, WorkHandle>> sending_;    // by tag, until waited for
  PipelineTimeline timeline_;
  std::chrono::steady_clock::time_point step_start_;
};

}  // namespace shardtrain::detail
