// LoRA adapters on the reference model's linear layers and on torch::nn::Linear layers.
#include "shardtrain/lora.h"

#include <torch/nn/init.h>
#include <torch/nn/modules/linear.h>

#include <cmath>
#include <mutex>
#include <set>
#include <stdexcept>
#include <unordered_map>

#include "model/init.h"
#include "model/layers.h"
#include "model/names.h"
#include "shardtrain/model.h"

namespace shardtrain {
namespace {

// Adapters of torch::nn::Linear layers, by the layer's address. The layer is held weakly: an
// entry whose layer is gone is ignored (another module may have its address now).
struct AdapterTable {
  std::mutex mutex;
  std::unordered_map<
      const torch::nn::Module*,
      std::pair<std::weak_ptr<torch::nn::Module>, std::shared_ptr<const detail::LoraAdapter>>>
      entries;
};

AdapterTable& adapter_table() {
  static AdapterTable* instance = new AdapterTable;  // never destroyed: used at exit
  return *instance;
}

bool matches(const std::string& name, const std::vector<std::string>& targets) {
  for (const auto& target : targets) {
    if (target == "all-linear" ? !detail::is_output_head(name)
                               : detail::last_component_is(name, target)) {
      return true;
    }
  }
  return false;
}

void check_options(const LoraOptions& options) {
  if (options.rank_ <= 0) {
    throw std::invalid_argument("LoRA rank must be positive, got " + std::to_string(options.rank_));
  }
  if (!(options.alpha_ >= 0) || !std::isfinite(options.alpha_)) {
    throw std::invalid_argument("LoRA alpha must be a finite number >= 0, got " +
                                std::to_string(options.alpha_));
  }
  if (!(options.dropout_ >= 0 && options.dropout_ < 1)) {
    throw std::invalid_argument("LoRA dropout must be in [0, 1), got " +
                                std::to_string(options.dropout_));
  }
  if (options.target_modules_.empty()) {
    throw std::invalid_argument(
        "LoRA target_modules is empty: name the linear layers to adapt "
        "(e.g. [\"attn.q\", \"attn.v\"]) or \"all-linear\"");
  }
}

bool is_linear(const torch::nn::Module& module) {
  return dynamic_cast<const detail::LinearImpl*>(&module) ||
         dynamic_cast<const torch::nn::LinearImpl*>(&module);
}

bool has_adapter(const torch::nn::Module& module) {
  return module.named_children().contains("lora_A");
}

}  // namespace

std::vector<std::string> lora_candidate_layers(const torch::nn::Module& model) {
  std::vector<std::string> names;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (is_linear(*item.value()) && !detail::is_adapter_layer(item.key()))
      names.push_back(item.key());
  }
  return names;
}

std::vector<std::string> add_lora(torch::nn::Module& model, const LoraOptions& options) {
  check_options(options);
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> chosen;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (is_linear(*item.value()) && !detail::is_adapter_layer(item.key()) &&
        matches(item.key(), options.target_modules_)) {
      chosen.emplace_back(item.key(), item.value());
    }
  }
  // Every entry must reach a layer: a misspelt one beside a good one would otherwise leave
  // layers without the adapters the run asked for.
  std::string unmatched;
  for (const auto& target : options.target_modules_) {
    bool used = false;
    for (const auto& item : chosen) used = used || matches(item.first, {target});
    if (!used) unmatched += (unmatched.empty() ? "" : ", ") + target;
  }
  if (!unmatched.empty()) {
    std::string layers;
    for (const auto& name : lora_candidate_layers(model)) {
      layers += (layers.empty() ? "" : ", ") + name;
    }
    throw std::invalid_argument(
        "LoRA target_modules [" + unmatched + "] match no linear layer" +
        (chosen.empty() ? "" : " (the other entries match " + std::to_string(chosen.size()) + ")") +
        "; the linear layers are: " + (layers.empty() ? std::string("(none)") : layers));
  }
  for (const auto& [name, layer] : chosen) {
    if (has_adapter(*layer)) {
      throw std::invalid_argument("LoRA: layer '" + name + "' already has an adapter");
    }
  }

  torch::NoGradGuard no_grad;
  auto* transformer = dynamic_cast<TransformerImpl*>(&model);
  const int64_t r = options.rank_;
  std::set<const at::TensorImpl*> adapters;
  std::vector<std::string> names;
  for (const auto& [name, layer] : chosen) {
    if (auto* own = dynamic_cast<detail::LinearImpl*>(layer.get())) {
      // Described only: the model's initializer gives them values (deferred or not), so a
      // sharded initialization equals the single-process one.
      const int64_t in = own->weight.size(1), out = own->weight.size(0);
      own->lora_a = own->register_module("lora_A", detail::Linear(in, r, false, true));
      own->lora_b = own->register_module("lora_B", detail::Linear(r, out, false, true));
      own->lora_scale = options.scale();
      own->lora_dropout = options.dropout_;
      adapters.insert(own->lora_a->weight.unsafeGetTensorImpl());
      adapters.insert(own->lora_b->weight.unsafeGetTensorImpl());
      if (!transformer && is_materialized(own->weight)) {
        // A block outside a Transformer: drawn here, as torch::nn::Linear would.
        for (const auto& p : {own->lora_a->weight, own->lora_b->weight}) {
          detail::restore_storage(p, static_cast<int64_t>(p.nbytes()));
        }
        const double bound = 1.0 / std::sqrt(static_cast<double>(in));
        own->lora_a->weight.uniform_(-bound, bound);
        own->lora_b->weight.zero_();
      }
    } else {
      auto* linear = dynamic_cast<torch::nn::LinearImpl*>(layer.get());
      const at::Tensor& weight = linear->weight;
      const int64_t in = weight.size(1), out = weight.size(0);
      auto on = [&weight](torch::nn::Linear l) {
        l->to(weight.device());
        return l;
      };
      // torch::nn::Linear's own initialization of A is the paper's (PEFT's kaiming_uniform
      // with a = sqrt(5)): uniform in +-1/sqrt(in).
      auto a = linear->register_module(
          "lora_A", on(torch::nn::Linear(torch::nn::LinearOptions(in, r).bias(false))));
      auto b = linear->register_module(
          "lora_B", on(torch::nn::Linear(torch::nn::LinearOptions(r, out).bias(false))));
      b->weight.zero_();
      adapters.insert(a->weight.unsafeGetTensorImpl());
      adapters.insert(b->weight.unsafeGetTensorImpl());
      auto adapter = std::make_shared<detail::LoraAdapter>();
      adapter->a = a->weight;
      adapter->b = b->weight;
      adapter->scale = options.scale();
      adapter->dropout = options.dropout_;
      AdapterTable& t = adapter_table();
      std::lock_guard<std::mutex> lock(t.mutex);
      t.entries[layer.get()] = {layer, std::move(adapter)};
    }
    names.push_back(name);
  }
  if (transformer) {
    // A materialized model's new adapters take their values now; a deferred one's come with
    // the rest when a strategy or materialize() initializes it.
    bool base_materialized = true;
    for (const auto& item : transformer->named_parameters()) {
      if (!adapters.count(item.value().unsafeGetTensorImpl()) && !is_materialized(item.value())) {
        base_materialized = false;
        break;
      }
    }
    if (base_materialized) transformer->materialize();
  }
  for (auto& p : model.parameters()) p.requires_grad_(adapters.count(p.unsafeGetTensorImpl()) > 0);
  return names;
}

at::Tensor merge_lora_weight(const at::Tensor& weight, const at::Tensor& a, const at::Tensor& b,
                             double scale) {
  return weight.to(at::kFloat) + at::matmul(b.to(at::kFloat), a.to(at::kFloat)) * scale;
}

namespace detail {

std::shared_ptr<const LoraAdapter> lora_adapter(const torch::nn::Module& module) {
  AdapterTable& t = adapter_table();
  std::lock_guard<std::mutex> lock(t.mutex);
  const auto it = t.entries.find(&module);
  if (it == t.entries.end()) return nullptr;
  if (it->second.first.lock().get() != &module) {
    t.entries.erase(it);  // the adapted layer is gone; this is another module
    return nullptr;
  }
  return it->second.second;
}

at::Tensor lora_delta(const at::Tensor& x, const at::Tensor& a, const at::Tensor& b, double scale,
                      double dropout, bool training) {
  at::Tensor input = dropout > 0 ? at::dropout(x, dropout, training) : x;
  // The adapter computes in the activations' dtype (its fp32 weights cast under bf16).
  const at::Tensor low = at::linear(input, a.to(x.scalar_type()));
  return at::linear(low, b.to(x.scalar_type())) * scale;
}

at::Tensor add_lora_output(const torch::nn::Module& module, const at::Tensor& input,
                           at::Tensor output) {
  const auto adapter = lora_adapter(module);
  if (!adapter) return output;
  return output + lora_delta(input, adapter->a, adapter->b, adapter->scale, adapter->dropout,
                             module.is_training());
}

}  // namespace detail
}  // namespace shardtrain
