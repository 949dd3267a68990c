// FSDP's wrap policies (which blocks become units) and the names of its options.
#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "parallel/fsdp/unit.h"

namespace shardtrain {
namespace {

// Names the blocks answer to, as users of PyTorch and accelerate write them (Hugging Face's
// class names first); the C++ type's own name last. The Llama family's block serves the models
// that share its layout, so it answers to their decoder layers' names too.
std::vector<std::string> class_aliases(const torch::nn::Module& module) {
  const std::string name = module.name();
  std::vector<std::string> aliases;
  if (name.find("Gpt2Block") != std::string::npos) {
    aliases.insert(aliases.end(), {"GPT2Block", "Gpt2Block"});
  }
  if (name.find("BertBlock") != std::string::npos) {
    aliases.insert(aliases.end(), {"BertLayer", "BertBlock"});
  }
  if (name.find("LlamaBlock") != std::string::npos) {
    aliases.insert(aliases.end(), {"LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer",
                                   "Qwen3DecoderLayer", "MixtralDecoderLayer",
                                   "Qwen3MoeDecoderLayer", "LlamaBlock"});
  }
  aliases.insert(aliases.end(), {"Block", "TransformerBlock", name});
  return aliases;
}

}  // namespace

namespace detail {

int64_t parameter_count(const torch::nn::Module& module) {
  int64_t total = 0;
  for (const auto& p : module.parameters()) total += p.numel();
  return total;
}

std::vector<std::vector<size_t>> plan_units(
    const std::vector<std::shared_ptr<torch::nn::Module>>& points, const WrapPolicy& policy) {
  std::vector<std::vector<size_t>> groups;
  switch (policy.kind) {
    case WrapPolicy::Kind::kBlocks:
      for (size_t i = 0; i < points.size(); ++i) groups.push_back({i});
      break;
    case WrapPolicy::Kind::kClassName: {
      for (size_t i = 0; i < points.size(); ++i) {
        const auto aliases = class_aliases(*points[i]);
        for (const auto& wanted : policy.class_names) {
          if (std::find(aliases.begin(), aliases.end(), wanted) != aliases.end()) {
            groups.push_back({i});
            break;
          }
        }
      }
      if (groups.empty()) {
        std::ostringstream msg;
        msg << "FSDP wrap policy: no module of the model has class";
        for (const auto& n : policy.class_names) msg << " '" << n << "'";
        msg << "; its blocks answer to";
        if (points.empty()) msg << " nothing (it has none)";
        const auto names = points.empty() ? std::vector<std::string>{} : class_aliases(*points[0]);
        for (size_t i = 0; i + 1 < names.size(); ++i) msg << (i ? ", '" : " '") << names[i] << "'";
        throw std::invalid_argument(msg.str());
      }
      break;
    }
    case WrapPolicy::Kind::kSize: {
      if (policy.min_params <= 0) {
        throw std::invalid_argument("FSDP wrap policy: min_params must be positive, got " +
                                    std::to_string(policy.min_params));
      }
      std::vector<size_t> current;
      int64_t count = 0;
      for (size_t i = 0; i < points.size(); ++i) {
        current.push_back(i);
        count += parameter_count(*points[i]);
        if (count >= policy.min_params) {
          groups.push_back(current);
          current.clear();
          count = 0;
        }
      }
      if (groups.empty()) {
        throw std::invalid_argument("FSDP wrap policy: no group of blocks reaches min_params = " +
                                    std::to_string(policy.min_params) +
                                    " (all blocks together have " + std::to_string(count) +
                                    "); lower parallel.fsdp.min_params or wrap by block");
      }
      // Blocks left below the minimum join the last unit.
      groups.back().insert(groups.back().end(), current.begin(), current.end());
      break;
    }
  }
  if (groups.empty()) {
    throw std::invalid_argument("FSDP wrap policy matched no module: the model has no blocks");
  }
  return groups;
}

}  // namespace detail

}  // namespace shardtrain
