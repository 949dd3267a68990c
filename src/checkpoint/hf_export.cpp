// Export of a trainer checkpoint as a Hugging Face model: the safetensors header is written first
// from the index, then each tensor's bytes, so only one tensor is in memory at a time.
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "checkpoint/model_description.h"
#include "checkpoint/safetensors_detail.h"
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

void export_hf_checkpoint(const std::string& checkpoint_dir, const std::string& out_dir,
                          bool overwrite) {
  const ShardedCheckpointReader reader(checkpoint_dir);
  const auto metadata = nlohmann::json::parse(reader.metadata());
  if (!metadata.contains("model")) {
    throw std::invalid_argument("checkpoint '" + checkpoint_dir +
                                "' has no model description in its metadata (it was not written "
                                "by the trainer), so its Hugging Face names are unknown");
  }
  const ModelConfig config =
      detail::model_from_description(metadata.at("model"), "checkpoint '" + checkpoint_dir + "'");
  const auto names = hf_parameter_names(config);

  std::vector<detail::SafetensorsStreamWriter::Entry> entries;
  for (const auto& n : names) {
    const TensorSpec* spec = reader.find(n.name);
    if (!spec) {
      throw std::invalid_argument("checkpoint '" + checkpoint_dir + "' has no tensor '" + n.name +
                                  "', which its " + to_string(config.family) + " model needs");
    }
    std::vector<int64_t> shape = spec->shape;
    if (n.transposed) std::reverse(shape.begin(), shape.end());
    entries.push_back({n.hf_name, spec->dtype, shape});
  }
  if (fs::exists(out_dir) && !fs::is_empty(out_dir) && !overwrite) {
    throw std::invalid_argument("ckpt export: '" + out_dir +
                                "' is not empty (pass --force to replace its model.safetensors "
                                "and config.json)");
  }
  fs::create_directories(out_dir);
  const fs::path model_partial = fs::path(out_dir) / ".model.safetensors.partial";
  const fs::path config_partial = fs::path(out_dir) / ".config.json.partial";
  try {
    // Both files are written in full under hidden names first, then renamed into place.
    {
      detail::SafetensorsStreamWriter writer(model_partial.string(), entries,
                                             {{"format", "pt"}});
      for (const auto& n : names) {
        at::Tensor tensor = reader.read(n.name);
        if (n.transposed) {
          write_transposed(writer, tensor);
        } else {
          writer.write(tensor);
        }
      }
      writer.finish();
    }
    {
      std::ofstream out(config_partial, std::ios::trunc);
      out << hf_config_json(config, reader.find(names.front().name)->dtype);
      out.close();
      if (!out) throw std::runtime_error("writing '" + config_partial.string() + "' failed");
    }
    detail::fsync_path(config_partial.string());
  } catch (...) {
    std::error_code ignored;  // a failed export leaves nothing behind
    fs::remove(model_partial, ignored);
    fs::remove(config_partial, ignored);
    throw;
  }
  fs::rename(model_partial, fs::path(out_dir) / "model.safetensors");
  fs::rename(config_partial, fs::path(out_dir) / "config.json");
  detail::fsync_path(out_dir);
}

}  // namespace shardtrain
