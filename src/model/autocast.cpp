#include "model/autocast.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

namespace shardtrain::detail {

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

AutocastScope::AutocastScope(const AutocastState& state) : saved_(autocast_state()) {
  set_autocast_state(state);
}

AutocastScope::~AutocastScope() {
  set_autocast_state(saved_);
  if (!saved_.cpu && !saved_.cuda) at::autocast::clear_cache();
}

AutocastState bf16_autocast(bool enabled, at::DeviceType device) {
  AutocastState state = autocast_state();
  if (enabled && device == at::kCUDA) {
    state.cuda = true;
    state.cuda_dtype = at::kBFloat16;
  } else if (enabled) {
    state.cpu = true;
    state.cpu_dtype = at::kBFloat16;
  }
  return state;
}

}  // namespace shardtrain::detail
