// The checkpoint autograd Function. Forward runs the block without recording a graph; backward
// replays it from the saved input and random-number state and differentiates the replay.
#include "model/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/version.h>

#include <mutex>

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

// Autocast is thread-local state that the backward pass usually runs outside of (the trainer
// scopes it to the forward); the recomputation must see the forward's, or it would compute in
// other dtypes.
struct AutocastState {
  bool cpu = false;
  bool cuda = false;
  at::ScalarType cpu_dtype = at::kBFloat16;
  at::ScalarType cuda_dtype = at::kHalf;
  bool cache = true;
};

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
AutocastState autocast_state() {
  return {at::autocast::is_autocast_enabled(at::kCPU), at::autocast::is_autocast_enabled(at::kCUDA),
          at::autocast::get_autocast_dtype(at::kCPU), at::autocast::get_autocast_dtype(at::kCUDA),
          at::autocast::is_autocast_cache_enabled()};
}
void set_autocast_state(const AutocastState& s) {
  at::autocast::set_autocast_enabled(at::kCPU, s.cpu);
  at::autocast::set_autocast_enabled(at::kCUDA, s.cuda);
  at::autocast::set_autocast_dtype(at::kCPU, s.cpu_dtype);
  at::autocast::set_autocast_dtype(at::kCUDA, s.cuda_dtype);
  at::autocast::set_autocast_cache_enabled(s.cache);
}
#else
AutocastState autocast_state() {
  return {at::autocast::is_cpu_enabled(), at::autocast::is_enabled(),
          at::autocast::get_autocast_cpu_dtype(), at::autocast::get_autocast_gpu_dtype(),
          at::autocast::is_autocast_cache_enabled()};
}
void set_autocast_state(const AutocastState& s) {
  at::autocast::set_cpu_enabled(s.cpu);
  at::autocast::set_enabled(s.cuda);
  at::autocast::set_autocast_cpu_dtype(s.cpu_dtype);
  at::autocast::set_autocast_gpu_dtype(s.cuda_dtype);
  at::autocast::set_autocast_cache_enabled(s.cache);
}
#endif

// Runs the recomputation under the forward's autocast settings. The weight-cast cache is off
// meanwhile: entries made during backward would outlive the caller's autocast scope and hand
// the next forward casts of weights the optimizer has since changed.
class AutocastReplay {
 public:
  explicit AutocastReplay(AutocastState replay) : saved_(autocast_state()) {
    replay.cache = false;
    set_autocast_state(replay);
  }
  ~AutocastReplay() { set_autocast_state(saved_); }
  AutocastReplay(const AutocastReplay&) = delete;
  AutocastReplay& operator=(const AutocastReplay&) = delete;

 private:
  AutocastState saved_;
};

// Non-tensor state of one checkpointed call; an IValue capsule carries it in the context.
struct CheckpointState : torch::CustomClassHolder {
  BlockFunction fn;
  RngState rng;
  AutocastState autocast;
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
      AutocastReplay autocast(state->autocast);
      at::AutoGradMode grad_mode(true);
      output = state->fn(input);
    }
    // A nested backward: parameter gradients accumulate into .grad exactly as they would have
    // through the original graph; the input's gradient is handed back to the outer pass.
    torch::autograd::backward({output}, {grad_outputs[0]});
    // One entry per forward argument: the state (not a tensor), the input, then each parameter,
    // whose gradient has already been accumulated.
    const auto num_params = static_cast<size_t>(ctx->saved_data["num_params"].toInt());
    variable_list grads(2 + num_params);
    grads[1] = input.grad();
    return grads;
  }
};

}  // namespace

at::Tensor checkpoint(BlockFunction fn, const at::Tensor& input,
                      const std::vector<at::Tensor>& params) {
  auto state = c10::make_intrusive<CheckpointState>();
  state->fn = std::move(fn);
  return CheckpointFunction::apply(std::move(state), input, at::TensorList(params));
}

}  // namespace shardtrain::detail
