// Autocast state (thread-local in LibTorch) as one value, read and set through the API of
// whichever LibTorch version this is built against.
#pragma once

#include <ATen/ATen.h>

namespace shardtrain::detail {

// Autocast is thread-local state that the backward pass usually runs outside of (the trainer
// scopes it to the forward); the recomputation of a checkpointed block must see the forward's,
// or it would compute in other dtypes.
struct AutocastState {
  bool cpu = false;
  bool cuda = false;
  at::ScalarType cpu_dtype = at::kBFloat16;
  at::ScalarType cuda_dtype = at::kHalf;
  bool cache = true;
};

AutocastState autocast_state();
void set_autocast_state(const AutocastState& state);

// Sets `state` for the scope and restores the previous state after. Leaving autocast entirely
// (the previous state has it off on every device) also clears the weight-cast cache, as the
// outermost autocast region does in PyTorch: cached casts would go stale after the optimizer
// step.
class AutocastScope {
 public:
  explicit AutocastScope(const AutocastState& state);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  AutocastState saved_;
};

// This thread's state with bf16 autocast on `device` (CPU or CUDA) switched on, or left as it
// is when !enabled.
AutocastState bf16_autocast(bool enabled, at::DeviceType device = at::kCPU);

}  // namespace shardtrain::detail
