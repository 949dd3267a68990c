// Tensor files in the safetensors format (a JSON header, then raw little-endian data: no
// pickle, no code on load) and checkpoint directories that appear atomically.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace shardtrain {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Writes `tensors` (any device; copied to CPU) to `path`, then fsyncs it. `metadata` goes into
// the header's "__metadata__". Throws std::runtime_error naming the file on I/O failure.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads every tensor of a safetensors file. The header must follow the format's rules (a JSON
// object under 100 MB; known dtypes; non-negative shapes whose byte count equals the tensor's
// data_offsets span; offsets that tile the data section with no gap, no overlap and nothing
// after the last tensor); a file that breaks one, or cannot be opened or read, throws
// std::invalid_argument naming the file and the tensor.
std::map<std::string, at::Tensor> load_safetensors(const std::string& path);

// A checkpoint directory under `root` named like "step_000100". begin() creates a hidden
// temporary directory to write into; commit() fsyncs it, renames it into place, points
// `root/latest` at it (also by rename) and removes the oldest complete checkpoints beyond
// `keep`. Until commit() the previous checkpoints and `latest` are untouched, so a process
// killed mid-save leaves them loadable.
class CheckpointWriter {
 public:
  // Removes the staging directories ("." NAME ".partial") that saves killed before their end
  // left in `root`: one save at a time writes there.
  CheckpointWriter(std::string root, std::string name, int keep);
  // The staging directory a writer for `root`/`name` uses, so that other ranks can write into it
  // once the writer exists.
  static std::string staging_path(const std::string& root, const std::string& name);
  // Where to write the files of this checkpoint.
  const std::string& staging_dir() const { return staging_; }
  // Returns the final directory.
  std::string commit();

 private:
  std::string root_;
  std::string name_;
  std::string staging_;
  int keep_;
};

// Resolves "latest" (via root/latest) or a directory path to a complete checkpoint directory;
// throws std::invalid_argument naming what is missing.
std::string resolve_checkpoint(const std::string& root, const std::string& which);

}  // namespace shardtrain
