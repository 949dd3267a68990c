// Import of Hugging Face safetensors weights into our modules.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "model/names.h"
#include "checkpoint/safetensors_detail.h"
#include "model/init.h"
#include "shardtrain/checkpoint.h"
#include "shardtrain/hf.h"

namespace fs = std::filesystem;

namespace shardtrain {
namespace {

// Buffers HF models carry that are not weights: GPT-2's causal masks, Llama's rotary frequencies.
bool is_ignored_buffer(const std::string& name) {
  using detail::ends_with;
  return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias") ||
         ends_with(name, "rotary_emb.inv_freq") || ends_with(name, "embeddings.position_ids") ||
         ends_with(name, "embeddings.token_type_ids");
}

// A BERT checkpoint's name as BertForMaskedLM's: BertModel files lack the "bert." prefix, and
// older ones call LayerNorm's weight and bias gamma and beta.
std::string bert_name(std::string key) {
  for (const char* part : {"embeddings.", "encoder.", "pooler."}) {
    if (key.rfind(part, 0) == 0) key = "bert." + key;
  }
  for (const auto& [old_name, name] : {std::pair<std::string, std::string>{".gamma", ".weight"},
                                       std::pair<std::string, std::string>{".beta", ".bias"}}) {
    if (detail::ends_with(key, "LayerNorm" + old_name)) {
      key = key.substr(0, key.size() - old_name.size()) + name;
    }
  }
  return key;
}

// What a BERT checkpoint may hold besides the masked-language model: the pooler and the
// next-sentence head (BertForPreTraining), not trained here, and the decoder tied to the word
// embeddings and to cls.predictions.bias.
bool is_outside_mlm(const std::string& name) {
  return name.rfind("bert.pooler.", 0) == 0 || name.rfind("cls.seq_relationship.", 0) == 0 ||
         name == "cls.predictions.decoder.weight" || name == "cls.predictions.decoder.bias";
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
    // Held in a variable: a range-for over items() of the parsed temporary would iterate a
    // destroyed object (the temporary's lifetime is not extended through at()).
    const nlohmann::json index = nlohmann::json::parse(in);
    for (const auto& [name, file] : index.at("weight_map").items()) {
      files.insert((fs::path(path) / file.get<std::string>()).string());
    }
    if (files.empty()) {
      throw std::invalid_argument("Hugging Face index '" + index_path.string() +
                                  "' maps no weights");
    }
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument("Hugging Face index '" + index_path.string() +
                                "' is corrupt: " + e.what());
  }
  return {files.begin(), files.end()};
}

namespace {

// Reads `bytes` at `offset` of `path` into `out`; std::runtime_error naming the file on a short
// read (a file truncated or replaced since its header was checked).
void read_range(const std::string& path, int64_t offset, int64_t bytes, void* out) {
  std::ifstream in(path, std::ios::binary);
  in.seekg(offset);
  if (!in || !in.read(static_cast<char*>(out), bytes)) {
    throw std::runtime_error("cannot read " + std::to_string(bytes) + " bytes at offset " +
                             std::to_string(offset) + " of '" + path + "'");
  }
}

}  // namespace

ParameterInitializer hf_initializer(const ModelConfig& config, const std::string& path) {
  const bool gpt2 = config.family == ModelFamily::kGpt2;
  const bool bert = config.family == ModelFamily::kBert;
  struct Source {
    std::string file;
    int64_t data_start = 0;
    detail::SafetensorsEntry entry;
    bool transposed = false;
  };
  std::map<std::string, Source> found;  // HF name -> where its bytes are
  for (const auto& file : hf_weight_files(path)) {
    const detail::SafetensorsHeader header = detail::read_safetensors_header(file);
    for (const auto& entry : header.entries) {
      // GPT2Model checkpoints (as the original "gpt2" repository) omit the "transformer." prefix.
      std::string key = entry.name;
      if (gpt2 && key.rfind("transformer.", 0) != 0 && key != "lm_head.weight") {
        key = "transformer." + key;
      }
      if (bert) key = bert_name(key);
      found[key] = {file, header.data_start, entry, false};
    }
  }
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& shape : config.parameter_shapes()) shapes[shape.name] = shape.shape;
  std::map<std::string, Source> sources;  // our name -> its source
  std::set<std::string> used;
  for (const auto& n : hf_parameter_names(config)) {
    auto it = found.find(n.hf_name);
    if (it == found.end()) {
      throw std::invalid_argument("Hugging Face weights '" + path + "' have no tensor '" +
                                  n.hf_name + "' (for parameter '" + n.name + "')");
    }
    const std::vector<int64_t>& ours = shapes.at(n.name);
    std::vector<int64_t> want = ours;
    if (n.transposed) std::reverse(want.begin(), want.end());
    if (it->second.entry.shape != want) {
      throw std::invalid_argument(
          "Hugging Face tensor '" + n.hf_name + "' in '" + it->second.file + "' has shape " +
          c10::str(at::IntArrayRef(it->second.entry.shape)) + ", but parameter '" + n.name +
          "' needs " + c10::str(at::IntArrayRef(want)));
    }
    sources[n.name] = it->second;
    sources[n.name].transposed = n.transposed;
    used.insert(n.hf_name);
  }
  for (const auto& [name, source] : found) {
    if (used.count(name) || is_ignored_buffer(name) || (bert && is_outside_mlm(name))) continue;
    // A tied head: HF files may still carry lm_head.weight, equal to the embedding.
    if (name == "lm_head.weight" && config.tie_embeddings) continue;
    throw std::invalid_argument("Hugging Face weights '" + path + "' have tensor '" + name +
                                "', which the " + to_string(config.family) +
                                " model has no parameter for (another family or layer count?)");
  }
  return [sources = std::move(sources)](const std::string& name, int64_t begin, at::Tensor out) {
    auto it = sources.find(name);
    if (it == sources.end()) {
      throw std::invalid_argument("the Hugging Face weights have no parameter '" + name + "'");
    }
    const Source& source = it->second;
    const int64_t numel = (source.entry.end - source.entry.begin) /
                          detail::dtype_bytes(source.entry.dtype);
    if (begin < 0 || begin + out.numel() > numel) {
      throw std::invalid_argument("elements [" + std::to_string(begin) + ", " +
                                  std::to_string(begin + out.numel()) + ") are outside parameter '" +
                                  name + "' of " + std::to_string(numel) + " elements");
    }
    at::NoGradGuard no_grad;
    const int64_t element = detail::dtype_bytes(source.entry.dtype);
    const int64_t first = source.data_start + source.entry.begin;
    if (!source.transposed) {
      // Exactly the bytes of the range: a rank reads only what it holds.
      at::Tensor raw = at::empty({out.numel()}, at::TensorOptions().dtype(source.entry.dtype));
      read_range(source.file, first + begin * element, out.numel() * element, raw.data_ptr());
      out.copy_(raw);
      return;
    }
    // A Conv1D weight's range is strided in the file: read the tensor (one parameter's worth of
    // memory, never the model's) and take the range of its transpose.
    at::Tensor raw = at::empty(source.entry.shape, at::TensorOptions().dtype(source.entry.dtype));
    read_range(source.file, first, numel * element, raw.data_ptr());
    out.copy_(raw.t().reshape({-1}).narrow(0, begin, out.numel()));
  };
}

void load_hf_weights(Transformer& model, const std::string& path) {
  detail::initialize_parameters(*model, hf_initializer(model->config(), path),
                                /*only_missing=*/false);
}

}  // namespace shardtrain
