#pragma once

#include <torch/optim/optimizer.h>

#include <sstream>
#include <string>
#include <type_traits>

namespace shardtrain::detail {

// The key of torch::optim::Optimizer::state(): the parameter's TensorImpl address, printed as
// a string in LibTorch 1.13, the address itself (void*) in LibTorch 2.x.
using OptimizerStateKey =
    std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;

// The key LibTorch's optimizers keep `parameter`'s state under.
template <typename Key = OptimizerStateKey>
Key optimizer_state_key(const at::Tensor& parameter) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;
    key << parameter.unsafeGetTensorImpl();
    return key.str();
  } else {
    return static_cast<Key>(parameter.unsafeGetTensorImpl());
  }
}

}  // namespace shardtrain::detail
