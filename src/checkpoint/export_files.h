// Writing an export folder: one safetensors file and one JSON file, each complete or absent.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

namespace shardtrain::detail {

// One tensor of an exported safetensors file: its key and dtype there, its shape as `values`
// returns it, and whether the file stores its transpose (GPT-2's Conv1D weights).
struct ExportTensor {
  std::string key;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  bool transposed = false;
  std::function<at::Tensor()> values;  // called once, when the tensor is written
};

// Writes OUT/weights_name (the tensors in order, one in memory at a time) and OUT/json_name,
// each under a hidden name first and renamed when complete; a failure removes both. OUT must be
// empty or absent unless `overwrite`. Throws std::invalid_argument for a non-empty OUT.
void write_export(const std::string& out_dir, bool overwrite, const std::string& weights_name,
                  const std::vector<ExportTensor>& tensors, const std::string& json_name,
                  const std::string& json_text);

// The run's tokenizer files (tokenizer.json, tokenizer_config.json, chat_template.jinja,
// special_tokens_map.json) copied into OUT beside the export, so that it is a whole model
// folder, when the checkpoint's metadata records a tokenizer.json folder that still holds them
// (training.tokenizer_path). Returns the names copied.
std::vector<std::string> copy_tokenizer_files(const std::string& metadata_json,
                                              const std::string& out_dir);

}  // namespace shardtrain::detail
