// Export of a LoRA run's checkpoint: its adapters in PEFT's layout, or the base model with the
// adapters merged into its weights.
#include <nlohmann/json.hpp>

#include <map>
#include <set>
#include <stdexcept>

#include "checkpoint/export_files.h"
#include "checkpoint/model_description.h"
#include "model/nf4.h"
#include "shardtrain/hf.h"
#include "shardtrain/lora.h"
#include "shardtrain/sharded_checkpoint.h"

namespace shardtrain {
namespace {

const std::string kA = ".lora_A.weight", kB = ".lora_B.weight";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The adapted layers of the checkpoint (ours, e.g. "blocks.0.attn.qkv"), in checkpoint order.
std::vector<std::string> adapted_layers(const ShardedCheckpointReader& reader) {
  std::vector<std::string> layers;
  for (const auto& spec : reader.tensors()) {
    if (ends_with(spec.name, kA)) layers.push_back(spec.name.substr(0, spec.name.size() - kA.size()));
  }
  return layers;
}

// The weights of the model's linear layers in its blocks: those lora.base_dtype stores.
std::vector<at::Tensor> detail_linear_weights(Transformer& model) {
  std::vector<at::Tensor> weights;
  for (const auto& item : model->named_parameters()) {
    if (item.key().rfind("blocks.", 0) == 0 && item.value().dim() == 2) weights.push_back(item.value());
  }
  return weights;
}

}  // namespace

void export_lora_checkpoint(const std::string& checkpoint_dir, const std::string& out_dir,
                            LoraExport what, const std::string& base, bool overwrite) {
  const ShardedCheckpointReader reader(checkpoint_dir);
  const auto metadata = nlohmann::json::parse(reader.metadata());
  const std::string source = "checkpoint '" + checkpoint_dir + "'";
  if (!metadata.contains("model") || !metadata.contains("lora")) {
    throw std::invalid_argument(source + " holds no LoRA adapters (it was not written by a run "
                                "with lora.rank > 0); export it without --lora");
  }
  const ModelConfig config = detail::model_from_description(metadata.at("model"), source);
  const nlohmann::json& lora = metadata.at("lora");
  double alpha = 0;
  int64_t rank = 0;
  try {
    alpha = lora.at("alpha").get<double>();
    rank = lora.at("rank").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(source + ": its LoRA settings are incomplete (" + e.what() + ")");
  }
  const std::vector<std::string> layers = adapted_layers(reader);
  if (layers.empty() || rank <= 0) {
    throw std::invalid_argument(source + " has no lora_A tensors");
  }
  std::map<std::string, HfParameterName> by_name;
  for (const auto& n : hf_parameter_names(config)) by_name[n.name] = n;
  auto hf_module = [&](const std::string& layer) {
    const auto it = by_name.find(layer + ".weight");
    if (it == by_name.end()) {
      throw std::invalid_argument(source + ": adapted layer '" + layer +
                                  "' is not a weight of its " + to_string(config.family) +
                                  " model");
    }
    const std::string& hf = it->second.hf_name;
    return std::make_pair(hf.substr(0, hf.size() - std::string(".weight").size()),
                          it->second.transposed);
  };

  if (what == LoraExport::kAdapters) {
    std::vector<detail::ExportTensor> tensors;
    std::set<std::string> targets;
    bool fan_in_fan_out = false;
    for (const auto& layer : layers) {
      const auto [module, transposed] = hf_module(layer);
      fan_in_fan_out = fan_in_fan_out || transposed;
      targets.insert(module.substr(module.rfind('.') + 1));
      for (const std::string& suffix : {kA, kB}) {
        const TensorSpec* spec = reader.find(layer + suffix);
        if (!spec) throw std::invalid_argument(source + " has no tensor '" + layer + suffix + "'");
        tensors.push_back({"base_model.model." + module + suffix, at::kFloat, spec->shape, false,
                           [&reader, name = layer + suffix] {
                             return reader.read(name).to(at::kFloat);
                           }});
      }
    }
    const nlohmann::json adapter_config = {
        {"peft_type", "LORA"},
        {"task_type", "CAUSAL_LM"},
        {"r", rank},
        {"lora_alpha", alpha},
        {"lora_dropout", lora.value("dropout", 0.0)},
        {"target_modules", std::vector<std::string>(targets.begin(), targets.end())},
        {"fan_in_fan_out", fan_in_fan_out},
        {"bias", "none"},
        {"inference_mode", true},
        {"base_model_name_or_path", lora.value("init_from", std::string())}};
    detail::write_export(out_dir, overwrite, "adapter_model.safetensors", tensors,
                         "adapter_config.json", adapter_config.dump(2) + "\n");
    return;
  }

  // Merged: the base model as the run built it, then W + (alpha / rank) B A per adapted layer.
  const std::string weights = base.empty() ? lora.value("init_from", std::string()) : base;
  ModelInit init = ModelInit().seed(static_cast<uint64_t>(lora.value("seed", int64_t{0})));
  if (!weights.empty()) init.values(hf_initializer(config, weights));
  Transformer model(config, std::move(init));
  const std::string base_dtype = lora.value("base_dtype", std::string("fp32"));
  if (base_dtype != "fp32") {
    // The run computed with its base's linear weights rounded to bf16 or NF4: so does the merge.
    torch::NoGradGuard no_grad;
    for (const auto& layer : detail_linear_weights(model)) {
      layer.set_data(base_dtype == "nf4" ? detail::nf4_dequantize(detail::nf4_quantize(layer))
                                         : layer.to(at::kBFloat16));
    }
  }
  auto params = model->named_parameters();
  const std::set<std::string> adapted(layers.begin(), layers.end());
  std::vector<detail::ExportTensor> tensors;
  for (const auto& n : hf_parameter_names(config)) {
    const at::Tensor weight = params[n.name];
    const std::string layer = n.name.substr(0, n.name.size() - std::string(".weight").size());
    std::function<at::Tensor()> values = [weight] { return weight.detach().to(at::kFloat); };
    if (ends_with(n.name, ".weight") && adapted.count(layer)) {
      const double scale = alpha / static_cast<double>(rank);
      values = [&reader, weight, layer, scale, &source] {
        const at::Tensor a = reader.read(layer + kA), b = reader.read(layer + kB);
        if (a.size(1) != weight.size(1) || b.size(0) != weight.size(0) || a.size(0) != b.size(1)) {
          throw std::invalid_argument(source + ": the adapter of '" + layer + "' (A " +
                                      c10::str(a.sizes()) + ", B " + c10::str(b.sizes()) +
                                      ") does not fit its weight " + c10::str(weight.sizes()));
        }
        return merge_lora_weight(weight.detach(), a, b, scale);
      };
    }
    tensors.push_back({n.hf_name, at::kFloat, weight.sizes().vec(), n.transposed, values});
  }
  detail::write_export(out_dir, overwrite, "model.safetensors", tensors, "config.json",
                       hf_config_json(config, at::kFloat));
}

}  // namespace shardtrain
