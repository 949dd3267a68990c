// A callback after autograd accumulated a leaf parameter's gradient: what DDP and FSDP count to
// know that a bucket or a unit is ready for its reduction.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>

namespace torch::autograd {
struct Node;
}

namespace shardtrain::detail {

// Calls `callback` each time autograd has added a gradient into `param` (a post hook on its
// AccumulateGrad node, which runs once per backward with the whole gradient). The hook is taken
// off when this object goes, since the module may outlive what installed it.
class GradAccumulatedHook {
 public:
  GradAccumulatedHook(const at::Tensor& param, std::function<void()> callback);
  ~GradAccumulatedHook();
  GradAccumulatedHook(GradAccumulatedHook&& other) noexcept;
  GradAccumulatedHook(const GradAccumulatedHook&) = delete;
  GradAccumulatedHook& operator=(const GradAccumulatedHook&) = delete;
  GradAccumulatedHook& operator=(GradAccumulatedHook&&) = delete;

 private:
  std::shared_ptr<torch::autograd::Node> accumulator_;  // kept alive, so the hook stays on it
  const void* hook_ = nullptr;
};

}  // namespace shardtrain::detail
