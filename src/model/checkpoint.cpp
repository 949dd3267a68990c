// The checkpoint autograd Function. Forward runs the block without recording a graph; backward
// replays it from the saved input and random-number state and differentiates the replay.
#include "model/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>

#include <mutex>

#include "model/autocast.h"

namespace shardtrain::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// State of the default generators a block may draw dropout masks from: always the CPU one, and
// the CUDA one of the activations' device when they live there.
struct RngState {
  at::Tensor cpu;
  at::Tensor accelerator;
  at::Device device = at::kCPU;
};

at::Generator generator_for(const at::Device& device) {
  return device.is_cpu() ? at::detail::getDefaultCPUGenerator()
                         : at::globalContext().defaultGenerator(device);
}

at::Tensor get_state(at::Generator gen) {
  // The generators are shared by all threads; see Note [Acquire lock when using random
  // generators] in ATen.
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_state(at::Generator gen, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

RngState capture(const at::Device& device) {
  RngState state;
  state.cpu = get_state(at::detail::getDefaultCPUGenerator());
  state.device = device;
  if (device.is_cuda()) state.accelerator = get_state(generator_for(device));
  return state;
}

void restore(const RngState& state) {
  set_state(at::detail::getDefaultCPUGenerator(), state.cpu);
  if (state.accelerator.defined()) set_state(generator_for(state.device), state.accelerator);
}

// Puts the generators back to where they were before the recomputation, even if it throws, so
// that checkpointing leaves the random stream exactly as the non-checkpointed run would.
class RngReplay {
 public:
  explicit RngReplay(const RngState& replay) : saved_(capture(replay.device)) { restore(replay); }
  ~RngReplay() { restore(saved_); }
  RngReplay(const RngReplay&) = delete;
  RngReplay& operator=(const RngReplay&) = delete;

 private:
  RngState saved_;
};

// Runs the recomputation under the forward's autocast settings. The weight-cast cache is off
// meanwhile: entries made during backward would outlive the caller's autocast scope and hand
// the next forward casts of weights the optimizer has since changed.
AutocastState without_cache(AutocastState state) {
  state.cache = false;
  return state;
}

// Non-tensor state of one checkpointed call; an IValue capsule carries it in the context.
struct CheckpointState : torch::CustomClassHolder {
  BlockFunction fn;
  RngState rng;
  AutocastState autocast;
};

// Callbacks queued during a recomputation's nested backward, per nesting level of this thread
// (the engine runs a nested backward on the thread that started it).
thread_local std::vector<std::vector<std::function<void()>>> deferred_callbacks;
// Recomputations running on this thread (nested when a recomputation itself checkpoints).
thread_local int recomputations = 0;

// Around a nested backward: the callbacks queued inside it go to the enclosing backward.
class NestedBackward {
 public:
  NestedBackward() { deferred_callbacks.emplace_back(); }
  ~NestedBackward() {
    std::vector<std::function<void()>> mine = std::move(deferred_callbacks.back());
    deferred_callbacks.pop_back();
    for (auto& fn : mine) queue_backward_callback(std::move(fn));
  }
  NestedBackward(const NestedBackward&) = delete;
  NestedBackward& operator=(const NestedBackward&) = delete;
};

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, c10::intrusive_ptr<CheckpointState> state,
                            const at::Tensor& input, at::TensorList params) {
    state->rng = capture(input.device());
    state->autocast = autocast_state();
    at::Tensor output;
    {
      at::NoGradGuard no_grad;  // Function::apply already disables grad; be explicit
      output = state->fn(input);
    }
    ctx->save_for_backward({input});
    ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
    ctx->saved_data["num_params"] = static_cast<int64_t>(params.size());
    return output;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto state =
        c10::static_intrusive_pointer_cast<CheckpointState>(ctx->saved_data["state"].toCapsule());
    const at::Tensor input = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    at::Tensor output;
    {
      RngReplay rng(state->rng);
      AutocastScope autocast(without_cache(state->autocast));
      at::AutoGradMode grad_mode(true);
      ++recomputations;
      try {
        output = state->fn(input);
      } catch (...) {
        --recomputations;
        throw;
      }
      --recomputations;
    }
    // A nested backward: parameter gradients accumulate into .grad exactly as they would have
    // through the original graph; the input's gradient is handed back to the outer pass.
    {
      NestedBackward nested;
      torch::autograd::backward({output}, {grad_outputs[0]});
    }
    // One entry per forward argument: the state (not a tensor), the input, then each parameter,
    // whose gradient has already been accumulated.
    const auto num_params = static_cast<size_t>(ctx->saved_data["num_params"].toInt());
    variable_list grads(2 + num_params);
    grads[1] = input.grad();
    return grads;
  }
};

}  // namespace

bool recomputing() { return recomputations > 0; }

void queue_backward_callback(std::function<void()> fn) {
  if (!deferred_callbacks.empty()) {
    deferred_callbacks.back().push_back(std::move(fn));
    return;
  }
  torch::autograd::Engine::get_default_engine().queue_callback(std::move(fn));
}

at::Tensor checkpoint(BlockFunction fn, const at::Tensor& input,
                      const std::vector<at::Tensor>& params) {
  auto state = c10::make_intrusive<CheckpointState>();
  state->fn = std::move(fn);
  return CheckpointFunction::apply(std::move(state), input, at::TensorList(params));
}

}  // namespace shardtrain::detail
