// Removal of a module's hooks by address, for owners that may outlive the module.
#pragma once

#include "shardtrain/model.h"

namespace shardtrain::detail {

// Detaches the hooks at `module`'s address if they are still `hooks` (the address may belong to
// another module by now, with hooks of its own).
void clear_module_hooks(const torch::nn::Module* module, const ForwardHooks* hooks);

}  // namespace shardtrain::detail
