// Export of a trainer checkpoint as a Hugging Face model: the safetensors header is written first
// from the index, then each tensor's bytes, so only one tensor is in memory at a time.
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "checkpoint/export_files.h"
#include "checkpoint/model_description.h"
#include "checkpoint/safetensors_detail.h"
#include "common/file_error.h"
#include "shardtrain/hf.h"
#include "shardtrain/sharded_checkpoint.h"

namespace fs = std::filesystem;

namespace shardtrain {
namespace {

// Transposed [rows, cols] -> [cols, rows] is written in blocks of whole output rows, so the
// transpose never holds a second full copy of the tensor.
void write_transposed(detail::SafetensorsStreamWriter& writer, const at::Tensor& matrix) {
  const int64_t rows = matrix.size(0);
  const int64_t cols = matrix.size(1);
  // Column blocks of about 1 MiB, gathered into a small contiguous tile first and transposed
  // from there: transposing the strided block directly is several times slower (measured with
  // LibTorch 1.13 on one thread, a [4096, 1024] float matrix: 0.2 GB/s against 1 GB/s).
  constexpr int64_t kBlockBytes = 1 << 20;
  const int64_t per_column = std::max<int64_t>(1, rows * detail::dtype_bytes(matrix.scalar_type()));
  const int64_t block = std::max<int64_t>(1, kBlockBytes / per_column);
  for (int64_t c = 0; c < cols; c += block) {
    writer.write(matrix.narrow(1, c, std::min(block, cols - c)).contiguous().t().contiguous());
  }
}

}  // namespace

void detail::write_export(const std::string& out_dir, bool overwrite,
                          const std::string& weights_name, const std::vector<ExportTensor>& tensors,
                          const std::string& json_name, const std::string& json_text) {
  std::vector<detail::SafetensorsStreamWriter::Entry> entries;
  for (const auto& t : tensors) {
    std::vector<int64_t> shape = t.shape;
    if (t.transposed) std::reverse(shape.begin(), shape.end());
    entries.push_back({t.key, t.dtype, shape});
  }
  if (fs::exists(out_dir) && !fs::is_empty(out_dir) && !overwrite) {
    throw std::invalid_argument("ckpt export: '" + out_dir +
                                "' is not empty (pass --force to "
                                "replace its " +
                                weights_name + " and " + json_name + ")");
  }
  const bool made_dir = !fs::exists(out_dir);
  fs::create_directories(out_dir);
  const fs::path weights_partial = fs::path(out_dir) / ("." + weights_name + ".partial");
  const fs::path json_partial = fs::path(out_dir) / ("." + json_name + ".partial");
  try {
    // Both files are written in full under hidden names first, then renamed into place.
    {
      detail::SafetensorsStreamWriter writer(weights_partial.string(), entries, {{"format", "pt"}});
      for (const auto& t : tensors) {
        const at::Tensor values = t.values();
        if (t.transposed) {
          write_transposed(writer, values);
        } else {
          writer.write(values);
        }
      }
      writer.finish();
    }
    {
      errno = 0;
      std::ofstream out(json_partial, std::ios::trunc);
      out << json_text;
      out.close();
      if (!out) throw std::runtime_error(detail::cannot_write(json_partial.string()));
    }
    detail::fsync_path(json_partial.string());
  } catch (...) {
    std::error_code ignored;  // a failed export leaves nothing behind
    fs::remove(weights_partial, ignored);
    fs::remove(json_partial, ignored);
    if (made_dir) fs::remove(out_dir, ignored);  // only when empty
    throw;
  }
  fs::rename(weights_partial, fs::path(out_dir) / weights_name);
  fs::rename(json_partial, fs::path(out_dir) / json_name);
  detail::fsync_path(out_dir);
}

void export_hf_checkpoint(const std::string& checkpoint_dir, const std::string& out_dir,
                          bool overwrite) {
  const ShardedCheckpointReader reader(checkpoint_dir);
  const auto metadata = nlohmann::json::parse(reader.metadata());
  if (!metadata.contains("model")) {
    throw std::invalid_argument("checkpoint '" + checkpoint_dir +
                                "' has no model description in its metadata (it was not written "
                                "by the trainer), so its Hugging Face names are unknown");
  }
  if (metadata.contains("lora")) {
    throw std::invalid_argument("checkpoint '" + checkpoint_dir +
                                "' holds LoRA adapters, not a whole model: export them with "
                                "--lora adapters, or the model with them merged with --lora "
                                "merged");
  }
  const ModelConfig config =
      detail::model_from_description(metadata.at("model"), "checkpoint '" + checkpoint_dir + "'");
  std::vector<detail::ExportTensor> tensors;
  for (const auto& n : hf_parameter_names(config)) {
    const TensorSpec* spec = reader.find(n.name);
    if (!spec) {
      throw std::invalid_argument("checkpoint '" + checkpoint_dir + "' has no tensor '" + n.name +
                                  "', which its " + to_string(config.family) + " model needs");
    }
    tensors.push_back({n.hf_name, spec->dtype, spec->shape, n.transposed,
                       [&reader, name = n.name] { return reader.read(name); }});
  }
  detail::write_export(out_dir, overwrite, "model.safetensors", tensors, "config.json",
                       hf_config_json(config, tensors.front().dtype));
  detail::copy_tokenizer_files(reader.metadata(), out_dir);
}

std::vector<std::string> detail::copy_tokenizer_files(const std::string& metadata_json,
                                                      const std::string& out_dir) {
  std::vector<std::string> copied;
  const auto metadata = nlohmann::json::parse(metadata_json, nullptr, /*exceptions=*/false);
  if (!metadata.is_object() || !metadata.contains("training")) return copied;
  const auto& training = metadata.at("training");
  if (!training.is_object() || !training.contains("tokenizer_path")) return copied;
  const fs::path source = training.at("tokenizer_path").get<std::string>();
  std::error_code error;
  const fs::path folder = fs::is_directory(source, error) ? source : source.parent_path();
  if (!fs::exists(folder / "tokenizer.json", error)) return copied;
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                           "special_tokens_map.json"}) {
    if (!fs::exists(folder / name, error)) continue;
    fs::copy_file(folder / name, fs::path(out_dir) / name, fs::copy_options::overwrite_existing);
    copied.emplace_back(name);
  }
  return copied;
}

}  // namespace shardtrain
