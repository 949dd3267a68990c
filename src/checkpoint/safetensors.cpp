#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "checkpoint/safetensors_detail.h"
#include "common/file_error.h"
#include "shardtrain/checkpoint.h"

namespace shardtrain {

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> data;
  int64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    at::Tensor cpu = tensor.detach().to(at::kCPU).contiguous();
    const int64_t bytes = static_cast<int64_t>(cpu.nbytes());
    header[name] = {{"dtype", detail::safetensors_dtype(cpu.scalar_type())},
                    {"shape", cpu.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(cpu);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the format pads the header to 8 bytes
  errno = 0;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw std::runtime_error(detail::cannot_write(path));
  const uint64_t length = text.size();
  out.write(reinterpret_cast<const char*>(&length), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& tensor : data) {
    out.write(static_cast<const char*>(tensor.data_ptr()),
              static_cast<std::streamsize>(tensor.nbytes()));
  }
  out.close();
  if (!out) throw std::runtime_error(detail::cannot_write(path));
  detail::fsync_path(path);
}

std::map<std::string, at::Tensor> load_safetensors(const std::string& path) {
  const detail::SafetensorsHeader header = detail::read_safetensors_header(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument("safetensors file '" + path + "' cannot be opened");
  std::map<std::string, at::Tensor> tensors;
  for (const auto& e : header.entries) {
    at::Tensor tensor = at::empty(e.shape, e.dtype);
    in.seekg(header.data_start + e.begin);
    if (!in.read(static_cast<char*>(tensor.data_ptr()), e.end - e.begin)) {
      throw std::invalid_argument("safetensors file '" + path + "': tensor '" + e.name +
                                  "' cannot be read (truncated while reading?)");
    }
    tensors.emplace(e.name, tensor);
  }
  return tensors;
}

}  // namespace shardtrain
