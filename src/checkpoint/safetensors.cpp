#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "shardtrain/checkpoint.h"

namespace shardtrain {
namespace {

const std::map<at::ScalarType, std::string>& dtype_names() {
  static const std::map<at::ScalarType, std::string> names = {
      {at::kFloat, "F32"}, {at::kDouble, "F64"}, {at::kBFloat16, "BF16"}, {at::kHalf, "F16"},
      {at::kLong, "I64"},  {at::kInt, "I32"},    {at::kShort, "I16"},     {at::kChar, "I8"},
      {at::kByte, "U8"},   {at::kBool, "BOOL"}};
  return names;
}

at::ScalarType dtype_from(const std::string& name, const std::string& path,
                          const std::string& tensor) {
  for (const auto& [type, text] : dtype_names()) {
    if (text == name) return type;
  }
  throw std::invalid_argument("safetensors file '" + path + "': tensor '" + tensor +
                              "' has unsupported dtype '" + name + "'");
}

void fsync_path(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
}

}  // namespace

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> data;
  int64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    at::Tensor cpu = tensor.detach().to(at::kCPU).contiguous();
    auto it = dtype_names().find(cpu.scalar_type());
    TORCH_CHECK(it != dtype_names().end(), "save_safetensors: tensor '", name, "' has dtype ",
                cpu.scalar_type(), " which safetensors cannot hold");
    const int64_t bytes = static_cast<int64_t>(cpu.nbytes());
    header[name] = {{"dtype", it->second},
                    {"shape", cpu.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(cpu);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the format pads the header to 8 bytes
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw std::runtime_error("cannot write '" + path + "'");
  const uint64_t length = text.size();
  out.write(reinterpret_cast<const char*>(&length), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& tensor : data) {
    out.write(static_cast<const char*>(tensor.data_ptr()),
              static_cast<std::streamsize>(tensor.nbytes()));
  }
  out.close();
  if (!out) throw std::runtime_error("writing '" + path + "' failed");
  fsync_path(path);
}

std::map<std::string, at::Tensor> load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw std::invalid_argument("safetensors file '" + path + "' cannot be opened");
  const int64_t file_bytes = static_cast<int64_t>(in.tellg());
  in.seekg(0);
  uint64_t length = 0;
  if (file_bytes < 8 || !in.read(reinterpret_cast<char*>(&length), 8) ||
      length > static_cast<uint64_t>(file_bytes - 8)) {
    throw std::invalid_argument("safetensors file '" + path +
                                "' is truncated (its header does not fit in the file)");
  }
  std::string text(length, '\0');
  in.read(text.data(), static_cast<std::streamsize>(length));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw std::invalid_argument("safetensors file '" + path +
                                "' has a corrupt header: " + e.what());
  }
  const int64_t data_start = 8 + static_cast<int64_t>(length);
  std::map<std::string, at::Tensor> tensors;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    try {
      const auto dtype = dtype_from(entry.at("dtype").get<std::string>(), path, name);
      const auto shape = entry.at("shape").get<std::vector<int64_t>>();
      const auto offsets = entry.at("data_offsets").get<std::vector<int64_t>>();
      at::Tensor tensor = at::empty(shape, dtype);
      const int64_t bytes = static_cast<int64_t>(tensor.nbytes());
      if (offsets.size() != 2 || offsets[1] - offsets[0] != bytes || offsets[0] < 0 ||
          data_start + offsets[1] > file_bytes) {
        throw std::invalid_argument("safetensors file '" + path + "': tensor '" + name +
                                    "' lies outside the file (truncated?)");
      }
      in.seekg(data_start + offsets[0]);
      in.read(static_cast<char*>(tensor.data_ptr()), bytes);
      tensors.emplace(name, tensor);
    } catch (const nlohmann::json::exception& e) {
      throw std::invalid_argument("safetensors file '" + path + "': tensor '" + name +
                                  "' has a malformed entry: " + e.what());
    }
  }
  return tensors;
}

}  // namespace shardtrain
