// fully_shard for any module: which parameters a call shards (those no sharded module inside
// holds), the checks that make a wrong order or a shared parameter an error, and the handle.
#include <cmath>
#include <mutex>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "model/init.h"
#include "model/module_hooks.h"
#include "parallel/fsdp/shard_group.h"

namespace shardtrain {
namespace {

// Every sharded module and parameter of the process (ranks may be threads of one process, each
// with its own modules): the checks below need to know who shards what.
struct Registry {
  struct Entry {
    // The sharding lives as long as its module, as FSDP2's state lives on the module: the
    // handle is dropped once the module is gone (found at the next fully_shard call).
    std::weak_ptr<torch::nn::Module> module;
    std::shared_ptr<FSDPModule> handle;
    detail::ShardGroup* group = nullptr;
  };
  std::mutex mutex;
  std::unordered_map<const torch::nn::Module*, Entry> modules;
  std::unordered_map<const c10::TensorImpl*, const torch::nn::Module*> params;  // -> its module
};

// Never destroyed: at exit the handles it still holds would reach into it while it goes.
Registry& registry() {
  static Registry* instance = new Registry;
  return *instance;
}

// The module's path inside `outer` ("blocks.0"), or its class name when it is not there.
std::string path_in(const torch::nn::Module& outer, const torch::nn::Module& inner) {
  for (const auto& item : outer.named_modules()) {
    if (item.value().get() == &inner) return item.key().empty() ? outer.name() : item.key();
  }
  return inner.name();
}

bool starts_with(const std::string& name, const std::string& prefix) {
  return name.compare(0, prefix.size(), prefix) == 0;
}

// The first element of a shard in its parameter's row-major flattening.
int64_t flat_begin(const ShardedParameter& p) {
  int64_t row_numel = 1;
  for (size_t d = 1; d < p.shape.size(); ++d) row_numel *= p.shape[d];
  return p.row_begin * row_numel;
}

// The sharded modules inside the one being sharded, and the prefix of their tensors' names.
struct Inner {
  std::string prefix;
  std::shared_ptr<FSDPModule> handle;
  detail::ShardGroup* group;
};

// Drops the registry's entries of modules that are gone; their state is destroyed outside the
// lock (its destructors take it).
void forget_gone_modules() {
  std::vector<std::shared_ptr<FSDPModule>> gone;
  {
    Registry& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mutex);
    for (auto it = reg.modules.begin(); it != reg.modules.end();) {
      if (it->second.module.expired()) {
        gone.push_back(std::move(it->second.handle));
        it = reg.modules.erase(it);
      } else {
        ++it;
      }
    }
  }
  gone.clear();
}

// What fully_shard(module) shards itself: the parameters and buffers that no sharded module
// inside it holds (`own`, `own_buffers`), and those inner modules. Throws std::invalid_argument
// for a module sharded already, one inside a sharded module, or a parameter another sharded
// module holds.
void claim_tensors(const std::shared_ptr<torch::nn::Module>& module,
                   std::vector<std::pair<std::string, at::Tensor>>& own,
                   std::vector<at::Tensor>& own_buffers, std::vector<Inner>& inner) {
  const std::string name = module->name();
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  if (reg.modules.count(module.get())) {
    throw std::invalid_argument("fully_shard: module " + name +
                                " is sharded already; apply fully_shard once per module");
  }
  for (const auto& [other, entry] : reg.modules) {
    if (entry.group->subtree().count(module.get())) {
      throw std::invalid_argument(
          "fully_shard: module '" + path_in(*other, *module) + "' (" + name + ") lies inside " +
          other->name() +
          ", which was sharded first; apply fully_shard to the children first, then to the "
          "parent");
    }
  }
  // The sharded modules inside this one, and the prefix of their tensors' names.
  for (const auto& item : module->named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    const auto found = reg.modules.find(item.value().get());
    if (found == reg.modules.end()) continue;
    inner.push_back({item.key() + ".", found->second.handle, found->second.group});
  }
  // The sharded module inside this one that `name` lies in, or null.
  auto inner_module_of = [&inner](const std::string& name) -> const torch::nn::Module* {
    const torch::nn::Module* under = nullptr;
    for (const auto& item : inner) {
      if (starts_with(name, item.prefix)) under = item.group->module_address();
    }
    return under;
  };
  for (const auto& item : module->named_buffers(/*recurse=*/true)) {
    if (!inner_module_of(item.key())) own_buffers.push_back(item.value());
  }
  std::unordered_set<const c10::TensorImpl*> taken;  // by this module
  for (const auto& item : module->named_parameters(/*recurse=*/true)) {
    const std::string& pname = item.key();
    const at::Tensor& tensor = item.value();
    const torch::nn::Module* under = inner_module_of(pname);
    const auto owner = reg.params.find(tensor.unsafeGetTensorImpl());
    if (under) {
      if (owner != reg.params.end() && owner->second == under) continue;  // the inner one's
    } else if (owner == reg.params.end()) {
      if (taken.insert(tensor.unsafeGetTensorImpl()).second && tensor.numel() > 0) {
        own.emplace_back(pname, tensor);
      }
      continue;
    }
    const std::string holder =
        owner == reg.params.end() ? std::string("another module") : owner->second->name();
    throw std::invalid_argument(
        "fully_shard: parameter '" + pname + "' of " + name +
        " is the same tensor as a parameter that fully_shard(" + holder +
        ") shards already; a parameter shared between modules must be sharded with their "
        "common parent: apply fully_shard to the parent only");
  }
}

}  // namespace

std::shared_ptr<FSDPModule> fully_shard(std::shared_ptr<torch::nn::Module> module,
                                        const DeviceMesh& mesh, FullyShardOptions options) {
  if (!module) throw std::invalid_argument("fully_shard: the module is null");
  const std::string name = module->name();
  if (module->parameters().empty()) {
    throw std::invalid_argument("fully_shard: module " + name +
                                " has no parameters; there is nothing to shard");
  }
  forget_gone_modules();
  auto group = std::make_shared<detail::ShardGroup>(*module, mesh, options);
  std::vector<std::pair<std::string, at::Tensor>> own;
  std::vector<at::Tensor> own_buffers;
  std::vector<Inner> inner;
  claim_tensors(module, own, own_buffers, inner);

  group->shard(std::move(own), std::move(own_buffers));
  for (auto& item : inner) group->adopt(item.prefix, std::move(item.handle), *item.group);
  auto handle = std::shared_ptr<FSDPModule>(new FSDPModule(std::move(group)));
  {
    Registry& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mutex);
    reg.modules[module.get()] = {module, handle, handle->group_.get()};
    for (const auto& p : handle->group_->params()) {
      reg.params[p.param.unsafeGetTensorImpl()] = module.get();
    }
  }
  set_module_hooks(*module, handle->group_);
  return handle;
}

FSDPModule::FSDPModule(std::shared_ptr<detail::ShardGroup> group) : group_(std::move(group)) {}

FSDPModule::~FSDPModule() {
  // The module may be gone and its address taken by another: only this handle's entries go.
  const torch::nn::Module* module = group_->module_address();
  detail::clear_module_hooks(module, group_.get());
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  const auto it = reg.modules.find(module);
  if (it != reg.modules.end() && it->second.group == group_.get()) reg.modules.erase(it);
  for (const auto& p : group_->params()) reg.params.erase(p.param.unsafeGetTensorImpl());
}

torch::nn::Module& FSDPModule::module() const { return group_->module(); }

std::vector<ShardedParameter> FSDPModule::sharded_parameters(bool recurse) const {
  std::vector<ShardedParameter> out;
  for (const auto& [prefix, group] : group_->tree()) {
    if (!recurse && group != group_.get()) continue;
    for (const auto& p : group->params()) {
      out.push_back({prefix + p.name, p.shape, p.row_begin, p.local});
    }
  }
  return out;
}

std::vector<at::Tensor> FSDPModule::parameters(bool recurse) const {
  std::vector<at::Tensor> out;
  for (const auto& p : sharded_parameters(recurse)) out.push_back(p.local);
  return out;
}

void FSDPModule::unshard(bool async) { group_->unshard(async); }
void FSDPModule::wait_for_unshard() { group_->wait_for_unshard(); }
void FSDPModule::reshard() { group_->reshard(); }

void FSDPModule::set_requires_gradient_sync(bool value) {
  for (auto& [prefix, group] : group_->tree()) group->sync = value;
}

void FSDPModule::set_reshard_after_backward(bool value) {
  for (auto& [prefix, group] : group_->tree()) group->reshard_after_backward = value;
}

void FSDPModule::set_modules_to_forward_prefetch(std::vector<std::shared_ptr<FSDPModule>> modules) {
  group_->forward_prefetch.assign(modules.begin(), modules.end());
}

void FSDPModule::set_modules_to_backward_prefetch(
    std::vector<std::shared_ptr<FSDPModule>> modules) {
  group_->backward_prefetch.assign(modules.begin(), modules.end());
}

double FSDPModule::clip_grad_norm(double max_norm) {
  at::Tensor squares = at::zeros({}, at::kDouble);
  for (const auto& p : sharded_parameters()) {
    if (p.local.grad().defined()) squares += p.local.grad().to(at::kDouble).pow(2).sum();
  }
  if (ProcessGroup* shards = group_->shard_group()) {
    shards->all_reduce(squares, ReduceOp::kSum)->wait();
  }
  const double norm = std::sqrt(squares.item<double>());
  // torch.nn.utils.clip_grad_norm_'s rule, so that runs match single-process training.
  const double factor = max_norm / (norm + 1e-6);
  if (max_norm > 0 && factor < 1.0) {
    for (const auto& p : sharded_parameters()) {
      if (p.local.grad().defined()) p.local.mutable_grad().mul_(factor);
    }
  }
  return norm;
}

std::vector<std::pair<std::string, at::Tensor>> FSDPModule::full_state_dict() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [prefix, group] : group_->tree()) {
    const auto values = group->gather_full();
    for (size_t k = 0; k < values.size(); ++k) {
      out.emplace_back(prefix + group->params()[k].name, values[k]);
    }
  }
  for (const auto& item : module().named_buffers()) {
    out.emplace_back(item.key(), item.value().detach().clone());
  }
  return out;
}

std::pair<std::vector<TensorSpec>, std::vector<FlatSlice>> FSDPModule::checkpoint_slices() const {
  std::pair<std::vector<TensorSpec>, std::vector<FlatSlice>> out;
  for (const auto& p : sharded_parameters()) {
    out.first.push_back({p.name, p.shape, at::kFloat});
    if (group_->writes_checkpoint() && p.local.numel() > 0) {
      out.second.push_back({p.name, flat_begin(p), p.local.detach().reshape({-1})});
    }
  }
  for (const auto& item : module().named_buffers()) {
    const at::Tensor& b = item.value();
    out.first.push_back({item.key(), b.sizes().vec(), b.scalar_type()});
    if (group_->leads_buffers()) out.second.push_back({item.key(), 0, b.detach().reshape({-1})});
  }
  return out;
}

void FSDPModule::load_checkpoint(const ShardedCheckpointReader& reader) {
  auto check_shape = [&reader](const std::string& name, const std::vector<int64_t>& shape) {
    const TensorSpec* spec = reader.find(name);
    if (!spec) {
      throw std::invalid_argument("checkpoint " + reader.dir() + " has no tensor '" + name + "'");
    }
    if (spec->shape != shape) {
      throw std::invalid_argument("checkpoint " + reader.dir() + ": tensor '" + name +
                                  "' has another shape than the module's");
    }
  };
  torch::NoGradGuard no_grad;
  for (const auto& p : sharded_parameters()) {
    check_shape(p.name, p.shape);
    if (p.local.numel() == 0) continue;
    at::Tensor values = reader.read_flat(p.name, flat_begin(p), p.local.numel());
    p.local.detach().view({-1}).copy_(values.to(at::kFloat));
  }
  for (const auto& item : module().named_buffers()) {
    check_shape(item.key(), item.value().sizes().vec());
    item.value().copy_(reader.read(item.key()));
  }
  // A gathered copy would hold the old values.
  for (auto& [prefix, group] : group_->tree()) group->reshard();
}

}  // namespace shardtrain
