// A process group carried through autograd: a torch::autograd::Function saves IValues, so its
// forward keeps the group it communicates on as an integer handle for its backward. The group
// outlives every graph built with it (the model holds it).
#pragma once

#include <torch/autograd.h>

#include <cstdint>

#include "shardtrain/dist.h"

namespace shardtrain::detail {

inline int64_t group_handle(ProcessGroup& group) { return reinterpret_cast<intptr_t>(&group); }

// The group a forward saved as ctx->saved_data["group"] = group_handle(group).
inline ProcessGroup& saved_group(torch::autograd::AutogradContext* ctx) {
  return *reinterpret_cast<ProcessGroup*>(ctx->saved_data["group"].toInt());
}

}  // namespace shardtrain::detail
