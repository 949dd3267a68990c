// Export of a LoRA run's checkpoint: its adapters in PEFT's layout, or the base model with the
// adapters merged into its weights.
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "checkpoint/export_files.h"
#include "checkpoint/model_description.h"
#include "model/layers.h"
#include "model/names.h"
#include "shardtrain/hf.h"
#include "shardtrain/lora.h"
#include "shardtrain/sharded_checkpoint.h"

namespace shardtrain {
namespace {

const std::string kA = ".lora_A.weight", kB = ".lora_B.weight";

// The adapted layers of the checkpoint (ours, e.g. "blocks.0.attn.qkv"), in checkpoint order.
std::vector<std::string> adapted_layers(const ShardedCheckpointReader& reader) {
  std::vector<std::string> layers;
  for (const auto& spec : reader.tensors()) {
    if (detail::ends_with(spec.name, kA))
      layers.push_back(spec.name.substr(0, spec.name.size() - kA.size()));
  }
  return layers;
}

}  // namespace

void export_lora_checkpoint(const std::string& checkpoint_dir, const std::string& out_dir,
                            LoraExport what, const std::string& base, bool overwrite) {
  const ShardedCheckpointReader reader(checkpoint_dir);
  const auto metadata = nlohmann::json::parse(reader.metadata());
  const std::string source = "checkpoint '" + checkpoint_dir + "'";
  if (!metadata.contains("model") || !metadata.contains("lora")) {
    throw std::invalid_argument(source +
                                " holds no LoRA adapters (it was not written by a run "
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
      // PEFT adapts a module whose name is a target or ends with "." and one. The decoders'
      // layers have names of their own (q_proj, c_attn); BERT's share "dense" among four
      // kinds and "output.dense" between two, so its targets are the full module names.
      targets.insert(config.bidirectional() ? module : module.substr(module.rfind('.') + 1));
      for (const std::string& suffix : {kA, kB}) {
        const TensorSpec* spec = reader.find(layer + suffix);
        if (!spec) throw std::invalid_argument(source + " has no tensor '" + layer + suffix + "'");
        tensors.push_back(
            {"base_model.model." + module + suffix, at::kFloat, spec->shape, false,
             [&reader, name = layer + suffix] { return reader.read(name).to(at::kFloat); }});
      }
    }
    nlohmann::json adapter_config = {
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
    // PEFT has no masked-language-model task: a BERT adapter names none (PeftModel).
    if (config.bidirectional()) adapter_config.erase("task_type");
    detail::write_export(out_dir, overwrite, "adapter_model.safetensors", tensors,
                         "adapter_config.json", adapter_config.dump(2) + "\n");
    // As PEFT saves a fine-tune: the adapters with the tokenizer they were trained with.
    detail::copy_tokenizer_files(reader.metadata(), out_dir);
    return;
  }

  // Merged: the base model as the run built it, then W + (alpha / rank) B A per adapted layer.
  const std::string weights = base.empty() ? lora.value("init_from", std::string()) : base;
  ModelInit init = ModelInit().seed(static_cast<uint64_t>(lora.value("seed", int64_t{0})));
  if (!weights.empty()) init.values(hf_initializer(config, weights));
  Transformer model(config, std::move(init));
  // The base stored as the run stored it (lora.base_dtype), so that the merge starts from the
  // weights the run computed with.
  const std::string base_dtype = lora.value("base_dtype", std::string("fp32"));
  if (base_dtype != "fp32") {
    for (auto& p : model->parameters()) p.requires_grad_(false);
    detail::store_frozen_linears(*model, base_dtype);
  }
  std::map<std::string, std::vector<int64_t>> packed;  // weight name -> shape, for NF4 ones
  for (const auto& item : model->named_modules("", /*include_self=*/false)) {
    const auto* linear = dynamic_cast<const detail::LinearImpl*>(item.value().get());
    if (linear && !linear->nf4_shape.empty()) packed[item.key() + ".weight"] = linear->nf4_shape;
  }
  auto params = model->named_parameters();
  const std::set<std::string> adapted(layers.begin(), layers.end());
  std::vector<detail::ExportTensor> tensors;
  for (const auto& n : hf_parameter_names(config)) {
    const auto it = packed.find(n.name);
    const std::vector<int64_t> nf4_shape = it == packed.end() ? std::vector<int64_t>() : it->second;
    const at::Tensor stored = params[n.name];
    // Unpacked to fp32 only as it is written: one weight at a time beside the stored base.
    std::function<at::Tensor()> values = [stored, nf4_shape] {
      return detail::stored_weight_values(stored, nf4_shape, at::kFloat);
    };
    const std::string layer = n.name.substr(0, n.name.size() - std::string(".weight").size());
    if (detail::ends_with(n.name, ".weight") && adapted.count(layer)) {
      const double scale = alpha / static_cast<double>(rank);
      values = [&reader, unpacked = values, layer, scale, &source] {
        const at::Tensor weight = unpacked();
        const at::Tensor a = reader.read(layer + kA), b = reader.read(layer + kB);
        if (a.size(1) != weight.size(1) || b.size(0) != weight.size(0) || a.size(0) != b.size(1)) {
          throw std::invalid_argument(source + ": the adapter of '" + layer + "' (A " +
                                      c10::str(a.sizes()) + ", B " + c10::str(b.sizes()) +
                                      ") does not fit its weight " + c10::str(weight.sizes()));
        }
        return merge_lora_weight(weight, a, b, scale);
      };
    }
    tensors.push_back({n.hf_name, at::kFloat, nf4_shape.empty() ? stored.sizes().vec() : nf4_shape,
                       n.transposed, values});
  }
  detail::write_export(out_dir, overwrite, "model.safetensors", tensors, "config.json",
                       hf_config_json(config, at::kFloat));
  detail::copy_tokenizer_files(reader.metadata(), out_dir);
}

}  // namespace shardtrain
