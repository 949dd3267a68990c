// Forward hooks attached to modules of any kind, for shardtrain::call.
#include "model/module_hooks.h"

#include <mutex>
#include <unordered_map>

namespace shardtrain {
namespace {

struct HookTable {
  std::mutex mutex;
  std::unordered_map<const torch::nn::Module*, std::shared_ptr<ForwardHooks>> hooks;
};

// Never destroyed, so that owners destroyed at exit can still detach their hooks.
HookTable& hook_table() {
  static HookTable* instance = new HookTable;
  return *instance;
}

}  // namespace

void set_module_hooks(const torch::nn::Module& module, std::shared_ptr<ForwardHooks> hooks) {
  HookTable& t = hook_table();
  std::lock_guard<std::mutex> lock(t.mutex);
  if (hooks) {
    t.hooks[&module] = std::move(hooks);
  } else {
    t.hooks.erase(&module);
  }
}

std::shared_ptr<ForwardHooks> module_hooks(const torch::nn::Module& module) {
  HookTable& t = hook_table();
  std::lock_guard<std::mutex> lock(t.mutex);
  const auto it = t.hooks.find(&module);
  return it == t.hooks.end() ? nullptr : it->second;
}

namespace detail {

void clear_module_hooks(const torch::nn::Module* module, const ForwardHooks* hooks) {
  HookTable& t = hook_table();
  std::lock_guard<std::mutex> lock(t.mutex);
  const auto it = t.hooks.find(module);
  if (it != t.hooks.end() && it->second.get() == hooks) t.hooks.erase(it);
}

}  // namespace detail
}  // namespace shardtrain
