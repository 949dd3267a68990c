#include "parallel/pipeline/pipeline_runner.h"

#include <torch/csrc/autograd/autograd.h>

#include <stdexcept>

#include "model/autocast.h"
#include "parallel/tensor/tp_state.h"
#include "trace/telemetry.h"

namespace shardtrain::detail {
namespace {

using Kind = PipelineAction::Kind;

// Tags of the point-to-point messages: one per (receiving stage, micro-batch, direction), so a
// message matches its receive whatever order they are posted in. Evaluation's start above.
int message_tag(int stages, int stage, int micro_batch, bool gradient) {
  return ((micro_batch * stages) + stage) * 2 + (gradient ? 1 : 0);
}
constexpr int kForwardOnlyTag = 1 << 24;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

// What a stage keeps of a micro-batch between its forward and its backward.
struct PipelineRunner::Held {
  at::Tensor input;        // received activations (a leaf that requires grad), or tokens
  at::Tensor output;       // sent activations, or (last stage) the scaled loss or its input
  at::Tensor grad_output;  // received, (split last stage) the loss input's gradient, or undefined
  // The last stage of a split backward: the scaled loss of a copy of the loss's input (the
  // logits or the last block's output; `loss_input`, a leaf), so that the loss's backward runs
  // once (the vocabulary-parallel and the chunked losses can go backward only once) and the
  // stage's is split from its input's gradient like any other stage's. Other schedules keep
  // one graph to the loss, which holds no copy.
  at::Tensor loss, loss_input;
  bool input_gradient_done = false;
  // The gradient backward starts from at `output`: none for the loss.
  std::vector<at::Tensor> output_grads() const;
};

PipelineRunner::PipelineRunner(Transformer model, std::shared_ptr<ProcessGroup> group,
                               PipelineSchedule schedule,
                               std::vector<std::pair<int64_t, int64_t>> blocks, bool split_backward)
    : model_(std::move(model)),
      group_(std::move(group)),
      schedule_(std::move(schedule)),
      blocks_(std::move(blocks)),
      split_backward_(split_backward) {
  TORCH_CHECK(group_->size() == schedule_.ranks, "PipelineRunner: the pp group has ",
              group_->size(), " ranks, the schedule ", schedule_.ranks);
  // Each of this rank's stages: its blocks' parameters, the embeddings' on the first, the
  // final norm's and the head's (a tied one reads the token embedding) on the last.
  const int stages = schedule_.stages();
  const int64_t last_block = model_->config().n_layers;
  const std::string blocks_prefix = "blocks.";
  for (int s = group_->rank(); s < stages; s += schedule_.ranks) {
    const auto [begin, end] = blocks_.at(s);
    auto& params = stage_parameters_[s];
    for (const auto& item : model_->named_parameters()) {
      const std::string& name = item.key();
      bool mine = false;
      if (name.rfind(blocks_prefix, 0) == 0) {
        const int64_t block = std::stoll(name.substr(blocks_prefix.size()));
        mine = block >= begin && block < end;
      } else {
        const bool embedding = name.rfind("tok_emb.", 0) == 0 || name.rfind("pos_emb.", 0) == 0;
        const bool tied_head = model_->config().tie_embeddings && name.rfind("tok_emb.", 0) == 0;
        mine = (begin == 0 && embedding) || (end == last_block && (!embedding || tied_head));
      }
      if (mine && item.value().requires_grad()) params.push_back(item.value());
    }
  }
}

PipelineRunner::~PipelineRunner() = default;

at::Tensor PipelineRunner::activation(int64_t batch, int64_t length) const {
  const auto& tp = detail::tp_state(model_);
  const bool sequence_split = tp && tp->sequence_parallel && length % tp->size() == 0;
  const int64_t positions = sequence_split ? length / tp->size() : length;
  return at::empty({batch, positions, model_->config().d_model}, at::kFloat);
}

int PipelineRunner::sender_of(const PipelineAction& action) const {
  if (action.kind == Kind::kForward) return action.stage > 0 ? action.stage - 1 : -1;
  if (action.kind == Kind::kBackwardWeight) return -1;
  return action.stage < schedule_.stages() - 1 ? action.stage + 1 : -1;
}

void PipelineRunner::post_receive(const PipelineAction& action, int64_t batch, int64_t length) {
  const int from = sender_of(action);
  if (from < 0) return;
  const bool gradient = from > action.stage;
  const int tag = message_tag(schedule_.stages(), action.stage, action.micro_batch, gradient);
  if (receiving_.count(tag)) return;
  at::Tensor buffer = activation(batch, length);
  WorkHandle work = group_->recv(buffer, rank_of(from), tag);
  receiving_.emplace(tag, std::make_pair(buffer, std::move(work)));
}

at::Tensor PipelineRunner::take_received(const PipelineAction& action) {
  const bool gradient = sender_of(action) > action.stage;
  const int tag = message_tag(schedule_.stages(), action.stage, action.micro_batch, gradient);
  auto it = receiving_.find(tag);
  TORCH_CHECK(it != receiving_.end(), "pipeline: nothing posted for ", to_string(action));
  auto [buffer, work] = std::move(it->second);
  receiving_.erase(it);
  {
    TraceSpan span("pipeline recv", "comm",
                   {{"micro_batch", action.micro_batch}, {"stage", action.stage}});
    work->wait();
  }
  return buffer;
}

void PipelineRunner::send(at::Tensor tensor, int stage, int micro_batch, bool gradient) {
  at::Tensor wire = tensor.detach().to(at::kFloat).contiguous();
  const int tag = message_tag(schedule_.stages(), stage, micro_batch, gradient);
  WorkHandle work = group_->send(wire, rank_of(stage), tag);
  sending_.emplace(tag, std::make_pair(std::move(wire), std::move(work)));
}

void PipelineRunner::release_sent_activation(int stage, int micro_batch) {
  // The next stage received it before it could send the gradient this backward has: the wait
  // returns at once, and the activation is freed with the rest of the micro-batch (1F1B's bound
  // on what a stage holds counts on it) instead of at the end of the step.
  auto it = sending_.find(message_tag(schedule_.stages(), stage + 1, micro_batch, false));
  if (it == sending_.end()) return;
  it->second.second->wait();
  sending_.erase(it);
}

void PipelineRunner::wait_sends() {
  for (auto& [tag, sent] : sending_) sent.second->wait();
  sending_.clear();
}

std::vector<at::Tensor> PipelineRunner::Held::output_grads() const {
  if (!grad_output.defined()) return {};  // the loss
  return {grad_output.to(output.scalar_type())};
}

void PipelineRunner::backward(Held& held, bool whole, bool send_input_gradient, int stage,
                              int micro_batch) {
  const std::vector<at::Tensor> roots{held.output}, grads = held.output_grads();
  if (whole) {
    torch::autograd::backward(roots, grads);
    if (send_input_gradient) send(held.input.grad(), stage - 1, micro_batch, true);
    return;
  }
  // The input's gradient only, keeping the graph for the weights' gradients.
  const auto input_grad = torch::autograd::grad(roots, {held.input}, grads, /*retain_graph=*/true);
  send(input_grad.at(0), stage - 1, micro_batch, true);
}

void PipelineRunner::run(const PipelineAction& action, const PipelineStepInputs& inputs,
                         int64_t length, at::Tensor received, double& loss_sum) {
  const int stages = schedule_.stages();
  const int s = action.stage, mb = action.micro_batch;
  const auto key = std::make_pair(s, mb);
  const nlohmann::json args = {{"micro_batch", mb}, {"stage", s}};
  if (action.kind == Kind::kForward) {
    TraceSpan span("forward", "forward", args);
    auto held = std::make_unique<Held>();
    held->input = s == 0 ? inputs.tokens(mb) : received.requires_grad_(true);
    const auto [begin, end] = blocks_.at(s);
    AutocastScope autocast(bf16_autocast(inputs.bf16_autocast));
    const SequenceLayout layout = inputs.layout ? inputs.layout(mb) : SequenceLayout();
    at::Tensor output =
        model_->forward_stage(held->input, begin, end, length, layout, inputs.logits);
    if (s < stages - 1) {
      send(output, s + 1, mb, false);
      held->output = std::move(output);
    } else if (split_last_stage()) {
      held->loss_input = output.detach().requires_grad_(true);
      const at::Tensor loss = inputs.loss(held->loss_input, mb);
      loss_sum += loss.item<double>();
      held->loss = loss * inputs.loss_factor;
      held->output = std::move(output);
    } else {
      const at::Tensor loss = inputs.loss(output, mb);
      loss_sum += loss.item<double>();
      held->output = loss * inputs.loss_factor;
    }
    held_[key] = std::move(held);
    return;
  }
  auto it = held_.find(key);
  TORCH_CHECK(it != held_.end(), "pipeline: ", to_string(action), " before its forward");
  Held& held = *it->second;
  if (action.kind == Kind::kBackwardWeight) {
    if (!held.input_gradient_done) {  // split: the weights' half of the backward
      TraceSpan span("backward weights", "backward", args);
      const auto& params = stage_parameters_.at(s);
      if (!params.empty()) {
        torch::autograd::backward({held.output}, held.output_grads(), /*retain_graph=*/false,
                                  /*create_graph=*/false, params);
      }
    }
    held_.erase(it);
    return;
  }
  TraceSpan span(action.kind == Kind::kBackward ? "backward" : "backward input", "backward", args);
  if (s < stages - 1) {
    held.grad_output = std::move(received);
    release_sent_activation(s, mb);
  } else if (held.loss.defined()) {
    torch::autograd::backward({held.loss});
    held.grad_output = held.loss_input.grad();
    held.loss = held.loss_input = at::Tensor();
  }
  // The first stage has no input gradient to send, and under activation checkpointing the
  // recomputation accumulates the weights' gradients: those run the whole backward here.
  const bool whole = action.kind == Kind::kBackward || s == 0 || !split_backward_;
  backward(held, whole, s > 0, s, mb);
  if (action.kind == Kind::kBackward) {
    held_.erase(it);
  } else {
    held.input_gradient_done = whole;
    held.input = at::Tensor();
  }
}

double PipelineRunner::step(const PipelineStepInputs& inputs, int64_t length) {
  step_start_ = std::chrono::steady_clock::now();
  timeline_ = PipelineTimeline();
  const auto& actions = schedule_.actions.at(group_->rank());
  double loss_sum = 0.0;
  try {
    for (size_t i = 0; i < actions.size(); ++i) {
      // This action's message, and the next one's, so that it arrives while this one computes.
      post_receive(actions[i], inputs.batch, length);
      if (i + 1 < actions.size()) post_receive(actions[i + 1], inputs.batch, length);
      // The wait for this action's message is idle time, not the action's.
      at::Tensor received = sender_of(actions[i]) >= 0 ? take_received(actions[i]) : at::Tensor();
      const double start = seconds_since(step_start_);
      run(actions[i], inputs, length, std::move(received), loss_sum);
      timeline_.entries.push_back({actions[i], start, seconds_since(step_start_)});
    }
    wait_sends();
  } catch (...) {
    // The step failed (a peer gone, a bad batch): the run ends, so nothing is waited for.
    held_.clear();
    receiving_.clear();
    sending_.clear();
    throw;
  }
  TORCH_CHECK(held_.empty() && receiving_.empty(), "pipeline: the step left ", held_.size(),
              " micro-batch(es) held and ", receiving_.size(), " message(s) unreceived");
  timeline_.step_seconds = timeline_.entries.empty() ? 0 : timeline_.entries.back().end;
  return loss_sum;
}

at::Tensor PipelineRunner::forward(const at::Tensor& tokens, const SequenceLayout& layout,
                                   bool with_head) {
  const int stages = schedule_.stages();
  const int64_t length = tokens.size(1);
  at::Tensor x;
  for (int s = 0; s < stages; ++s) {
    if (rank_of(s) != group_->rank()) continue;
    at::Tensor input = tokens;
    if (s > 0) {
      input = activation(tokens.size(0), length);
      group_->recv(input, rank_of(s - 1), kForwardOnlyTag + s)->wait();
    }
    const auto [begin, end] = blocks_.at(s);
    x = model_->forward_stage(input, begin, end, length, layout, with_head);
    if (s < stages - 1) {
      const at::Tensor wire = x.to(at::kFloat).contiguous();
      group_->send(wire, rank_of(s + 1), kForwardOnlyTag + s + 1)->wait();
      x = at::Tensor();
    }
  }
  return x;
}

void PipelineRunner::sum_tied_gradients(ProcessGroup* average_first) {
  if (!model_->config().tie_embeddings || schedule_.ranks == 1) return;
  const int first = 0, last = last_stage_rank();
  const int rank = group_->rank();
  if (rank != first && rank != last) return;
  const at::Tensor weight = model_->named_parameters()["tok_emb.weight"];
  if (!weight.requires_grad()) return;
  if (!weight.grad().defined()) weight.mutable_grad() = at::zeros_like(weight);
  at::Tensor grad = weight.grad();
  if (average_first && average_first->size() > 1) {
    average_first->all_reduce(grad, ReduceOp::kAvg)->wait();
  }
  const at::Tensor mine = grad.contiguous().clone(), theirs = at::empty_like(mine);
  const int peer = rank == first ? last : first;
  constexpr int kTiedTag = kForwardOnlyTag - 1;
  WorkHandle sent = group_->send(mine, peer, kTiedTag);
  group_->recv(theirs, peer, kTiedTag)->wait();
  sent->wait();
  // Addition commutes exactly: both ranks hold the same sum.
  grad.add_(theirs);
}

}  // namespace shardtrain::detail
