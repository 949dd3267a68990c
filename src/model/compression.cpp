#include "model/compression.h"

#include <map>
#include <regex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "model/layers.h"
#include "model/names.h"
#include "shardtrain/hf.h"

namespace shardtrain::detail {
namespace {

// A layer a group may name: a linear layer, or the token embedding (weights only).
struct Layer {
  std::string name, hf_name;  // hf_name empty where the model has no Hugging Face layout
  LinearImpl* linear = nullptr;
  EmbeddingImpl* embedding = nullptr;
  const void* key() const {
    return linear ? static_cast<const void*>(linear) : static_cast<const void*>(embedding);
  }
  const at::Tensor& weight() const { return linear ? linear->weight : embedding->weight; }
};

std::string described(const Layer& layer) {
  return "'" + layer.name + "'" + (layer.hf_name.empty() ? "" : " (" + layer.hf_name + ")");
}

// The Hugging Face module names of `config`'s weights, by our module names.
std::map<std::string, std::string> hf_module_names(const ModelConfig& config) {
  std::map<std::string, std::string> names;
  std::vector<HfParameterName> parameters;
  try {
    parameters = hf_parameter_names(config);
  } catch (const std::invalid_argument&) {
    return names;  // a layout Hugging Face has not: our names only
  }
  const std::string suffix = ".weight";
  for (const auto& p : parameters) {
    if (ends_with(p.name, suffix) && ends_with(p.hf_name, suffix)) {
      names[p.name.substr(0, p.name.size() - suffix.size())] =
          p.hf_name.substr(0, p.hf_name.size() - suffix.size());
    }
  }
  return names;
}

std::regex compiled(const std::string& pattern, const std::string& key) {
  try {
    return std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw std::invalid_argument(key + ": '" + pattern + "' is not a regular expression (" +
                                e.what() + ")");
  }
}

// Each group's layers for one technique; every pattern must match, and no layer twice.
std::vector<std::vector<const Layer*>> match_groups(
    const std::vector<Layer>& layers, const std::vector<std::vector<std::string>>& groups,
    const std::string& key, const std::vector<std::string>& other_names, const std::string& what,
    const std::string& quantized) {
  std::vector<std::vector<const Layer*>> chosen(groups.size());
  std::map<const void*, std::string> claimed;  // layer -> the pattern that took it
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const auto& pattern : groups[g]) {
      const std::regex re = compiled(pattern, key);
      bool matched = false;
      for (const auto& layer : layers) {
        if (!std::regex_search(layer.name, re) &&
            !(!layer.hf_name.empty() && std::regex_search(layer.hf_name, re))) {
          continue;
        }
        matched = true;
        const auto [it, fresh] = claimed.emplace(layer.key(), pattern);
        if (!fresh) {
          throw std::invalid_argument(key + ": layer " + described(layer) +
                                      " is matched by both '" + it->second + "' and '" + pattern +
                                      "': each layer belongs to one group");
        }
        chosen[g].push_back(&layer);
      }
      if (matched) continue;
      std::string listed;
      for (size_t i = 0; i < layers.size() && i < 8; ++i) {
        listed += (listed.empty() ? "" : ", ") + described(layers[i]);
      }
      if (layers.size() > 8) listed += ", ... (" + std::to_string(layers.size()) + " in all)";
      std::string elsewhere;
      for (const auto& name : other_names) {
        if (std::regex_search(name, re)) {
          elsewhere = " ('" + name + "' is not quantized: only " + quantized + " are)";
          break;
        }
      }
      throw std::invalid_argument(key + ": '" + pattern + "' matches no " + what + elsewhere +
                                  "; the candidates are " +
                                  (listed.empty() ? std::string("(none)") : listed));
    }
  }
  return chosen;
}

}  // namespace

Compression::Compression(torch::nn::Module& model, const ModelConfig& config,
                         const CompressionSection& section)
    : switches_(std::make_shared<CompressionSwitches>()),
      weight_offset_(section.weight_offset),
      activation_offset_(section.activation_offset) {
  const std::map<std::string, std::string> hf_names = hf_module_names(config);
  std::vector<Layer> linears, weighted;   // weighted: the linear layers and the token embedding
  std::vector<std::string> other_names;   // modules no group may name, both namings
  std::vector<std::string> other_inputs;  // and those no activation group may name
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const auto found = hf_names.find(item.key());
    const std::string hf_name = found == hf_names.end() ? "" : found->second;
    auto* linear = dynamic_cast<LinearImpl*>(item.value().get());
    // The token embedding's lookups go through its forward; the other embeddings' rows are read
    // directly (positions, token types), and the output head's weight reaches the loss directly.
    auto* embedding =
        item.key() == "tok_emb" ? dynamic_cast<EmbeddingImpl*>(item.value().get()) : nullptr;
    if (linear && !is_adapter_layer(item.key()) && !is_output_head(item.key())) {
      linears.push_back(Layer{item.key(), hf_name, linear, nullptr});
      weighted.push_back(linears.back());
    } else if (embedding) {
      weighted.push_back(Layer{item.key(), hf_name, nullptr, embedding});
      other_inputs.push_back(item.key());
      if (!hf_name.empty()) other_inputs.push_back(hf_name);
    } else {
      other_names.push_back(item.key());
      if (!hf_name.empty()) other_names.push_back(hf_name);
    }
  }
  other_inputs.insert(other_inputs.end(), other_names.begin(), other_names.end());
  const auto weights =
      match_groups(weighted, section.weight_modules, "compression.weight_modules", other_names,
                   "linear layer or token embedding", "the linear layers and the token embedding");
  const auto inputs =
      match_groups(linears, section.activation_modules, "compression.activation_modules",
                   other_inputs, "linear layer", "the inputs of linear layers");
  for (size_t g = 0; g < weights.size(); ++g) {
    for (const Layer* matched : weights[g]) {
      if (matched->weight().numel() % section.weight_groups != 0) {
        throw std::invalid_argument(
            "compression.weight_groups = " + std::to_string(section.weight_groups) +
            " does not divide the " + std::to_string(matched->weight().numel()) +
            " elements of layer " + described(*matched));
      }
      const Quantizer quantizer{section.weight_bits[g], section.weight_groups,
                                section.weight_type == "symmetric"};
      if (matched->linear) {
        matched->linear->weight_quant = quantizer;
        matched->linear->compression = switches_;
      } else {
        matched->embedding->weight_quant = quantizer;
        matched->embedding->compression = switches_;
      }
      ++weight_layers_;
    }
  }
  for (size_t g = 0; g < inputs.size(); ++g) {
    for (const Layer* matched : inputs[g]) {
      matched->linear->input_quant =
          Quantizer{section.activation_bits[g], 1, section.activation_type == "symmetric"};
      matched->linear->compression = switches_;
      ++activation_layers_;
    }
  }
}

void Compression::set_step(int64_t step) {
  switches_->weights = step >= weight_offset_;
  switches_->activations = step >= activation_offset_;
}

}  // namespace shardtrain::detail
