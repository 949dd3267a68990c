// Import of Hugging Face safetensors weights into our modules.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "shardtrain/checkpoint.h"
#include "shardtrain/hf.h"

namespace fs = std::filesystem;

namespace shardtrain {
namespace {

// Buffers HF models carry that are not weights: GPT-2's causal masks, Llama's rotary frequencies.
bool is_ignored_buffer(const std::string& name) {
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends_with(".attn.bias") || ends_with(".attn.masked_bias") ||
         ends_with("rotary_emb.inv_freq");
}

}  // namespace

std::vector<std::string> hf_weight_files(const std::string& path) {
  if (!fs::is_directory(path)) {
    if (!fs::exists(path)) {
      throw std::invalid_argument("Hugging Face weights '" + path + "' do not exist");
    }
    return {path};
  }
  const fs::path single = fs::path(path) / "model.safetensors";
  if (fs::exists(single)) return {single.string()};
  const fs::path index_path = fs::path(path) / "model.safetensors.index.json";
  std::ifstream in(index_path);
  if (!in) {
    throw std::invalid_argument("Hugging Face folder '" + path +
                                "' has neither model.safetensors nor model.safetensors.index.json");
  }
  std::set<std::string> files;
  try {
    for (const auto& [name, file] : nlohmann::json::parse(in).at("weight_map").items()) {
      files.insert((fs::path(path) / file.get<std::string>()).string());
    }
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument("Hugging Face index '" + index_path.string() +
                                "' is corrupt: " + e.what());
  }
  return {files.begin(), files.end()};
}

void load_hf_weights(Transformer& model, const std::string& path) {
  const ModelConfig& config = model->config();
  const bool gpt2 = config.family == ModelFamily::kGpt2;
  std::map<std::string, std::pair<at::Tensor, std::string>> weights;  // HF name -> tensor, file
  for (const auto& file : hf_weight_files(path)) {
    for (auto& [name, tensor] : load_safetensors(file)) {
      // GPT2Model checkpoints (as the original "gpt2" repository) omit the "transformer." prefix.
      std::string key = name;
      if (gpt2 && key.rfind("transformer.", 0) != 0 && key != "lm_head.weight") {
        key = "transformer." + key;
      }
      weights[key] = {tensor, file};
    }
  }
  const auto params = model->named_parameters();
  torch::NoGradGuard no_grad;
  std::set<std::string> used;
  for (const auto& n : hf_parameter_names(config)) {
    auto it = weights.find(n.hf_name);
    if (it == weights.end()) {
      throw std::invalid_argument("Hugging Face weights '" + path + "' have no tensor '" +
                                  n.hf_name + "' (for parameter '" + n.name + "')");
    }
    at::Tensor source = n.transposed ? it->second.first.t() : it->second.first;
    at::Tensor target = params[n.name];
    if (!source.sizes().equals(target.sizes())) {
      throw std::invalid_argument(
          "Hugging Face tensor '" + n.hf_name + "' in '" + it->second.second + "' has shape " +
          c10::str(it->second.first.sizes()) + ", but parameter '" + n.name + "' needs " +
          c10::str(n.transposed ? target.t().sizes() : target.sizes()));
    }
    target.copy_(source);
    used.insert(n.hf_name);
  }
  for (const auto& [name, entry] : weights) {
    if (used.count(name) || is_ignored_buffer(name)) continue;
    // A tied head: HF files may still carry lm_head.weight, equal to the embedding.
    if (name == "lm_head.weight" && config.tie_embeddings) continue;
    throw std::invalid_argument("Hugging Face weights '" + path + "' have tensor '" + name +
                                "', which the " + to_string(config.family) +
                                " model has no parameter for (another family or layer count?)");
  }
}

}  // namespace shardtrain
