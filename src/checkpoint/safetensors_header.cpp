// The one reader of safetensors headers: every file this project loads (plain safetensors,
// Hugging Face weights, rank files of a sharded checkpoint) passes these rules before a byte of
// tensor data is trusted. They are the format's own: a size-limited JSON header; per tensor a
// known dtype, a shape of non-negative sizes whose byte count does not overflow and equals its
// data_offsets span; offsets that, sorted, tile the data section from 0 to the end of the file
// with no gap and no overlap.
#include <algorithm>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "checkpoint/safetensors_detail.h"
#include "shardtrain/sharded_checkpoint.h"

namespace shardtrain::detail {
namespace {

// The safetensors library refuses headers above 100 MB; so do we, before allocating one.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

}  // namespace

int64_t json_int64(const nlohmann::json& json, const std::string& what) {
  if (json.is_number_unsigned() &&
      json.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    throw std::invalid_argument(what + " is " + json.dump() + ", beyond a 64-bit integer");
  }
  if (!json.is_number_integer()) {
    throw std::invalid_argument(what + " must be an integer, got " + json.dump());
  }
  return json.get<int64_t>();
}

std::vector<int64_t> json_int64s(const nlohmann::json& json, const std::string& what) {
  if (!json.is_array()) {
    throw std::invalid_argument(what + " must be an array of integers, got " + json.dump());
  }
  std::vector<int64_t> values;
  for (const auto& item : json) values.push_back(json_int64(item, what));
  return values;
}

int64_t checked_numel(const std::vector<int64_t>& shape, const std::string& context) {
  int64_t numel = 1;
  for (const int64_t size : shape) {
    if (size < 0) {
      throw std::invalid_argument(context + " has a negative size in its shape " +
                                  shape_text(shape));
    }
    if (__builtin_mul_overflow(numel, size, &numel)) {
      throw std::invalid_argument(context + " has a shape " + shape_text(shape) +
                                  " whose element count overflows 64 bits");
    }
  }
  return numel;
}

int64_t checked_bytes(const std::vector<int64_t>& shape, at::ScalarType dtype,
                      const std::string& context) {
  int64_t bytes = 0;
  if (__builtin_mul_overflow(checked_numel(shape, context), dtype_bytes(dtype), &bytes)) {
    throw std::invalid_argument(context + " has a shape " + shape_text(shape) +
                                " whose byte count overflows 64 bits");
  }
  return bytes;
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  const std::string where = "safetensors file '" + path + "'";
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw std::invalid_argument(where + " cannot be opened");
  const int64_t file_bytes = static_cast<int64_t>(in.tellg());
  in.seekg(0);
  uint64_t length = 0;
  if (file_bytes < 8 || !in.read(reinterpret_cast<char*>(&length), 8)) {
    throw std::invalid_argument(where + " is truncated (shorter than its 8-byte header length)");
  }
  if (length > kMaxHeaderBytes) {
    throw std::invalid_argument(where + " declares a header of " + std::to_string(length) +
                                " bytes, more than the format's limit of " +
                                std::to_string(kMaxHeaderBytes));
  }
  if (length > static_cast<uint64_t>(file_bytes - 8)) {
    throw std::invalid_argument(where + " is truncated (its header does not fit in the file)");
  }
  std::string text(length, '\0');
  in.read(text.data(), static_cast<std::streamsize>(length));
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw std::invalid_argument(where + " has a corrupt header: " + e.what());
  }
  if (!json.is_object()) throw std::invalid_argument(where + " has a header that is not an object");

  SafetensorsHeader header;
  header.data_start = 8 + static_cast<int64_t>(length);
  for (const auto& [name, entry] : json.items()) {
    const std::string context = where + ": tensor '" + name + "'";
    try {
      if (name == "__metadata__") {
        header.metadata = entry.get<std::map<std::string, std::string>>();
        continue;
      }
      SafetensorsEntry e;
      e.name = name;
      e.dtype = dtype_from_safetensors(entry.at("dtype").get<std::string>(), context);
      e.shape = json_int64s(entry.at("shape"), context + ": shape");
      const auto offsets = json_int64s(entry.at("data_offsets"), context + ": data_offsets");
      if (offsets.size() != 2 || offsets[0] < 0 || offsets[1] < offsets[0]) {
        throw std::invalid_argument(context + " has invalid data_offsets (want [begin, end] with "
                                              "0 <= begin <= end)");
      }
      e.begin = offsets[0];
      e.end = offsets[1];
      const int64_t bytes = checked_bytes(e.shape, e.dtype, context);
      if (e.end - e.begin != bytes) {
        throw std::invalid_argument(context + " is " + safetensors_dtype(e.dtype) + " of shape " +
                                    shape_text(e.shape) + " (" + std::to_string(bytes) +
                                    " bytes), but its data_offsets span " +
                                    std::to_string(e.end - e.begin) + " bytes");
      }
      header.entries.push_back(std::move(e));
    } catch (const nlohmann::json::exception& error) {
      throw std::invalid_argument(context + " has a malformed entry: " + error.what());
    }
  }

  // Sorted by position, the tensors must tile the data section exactly.
  std::vector<const SafetensorsEntry*> order;
  for (const auto& e : header.entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  int64_t next = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry* e : order) {
    if (e->begin < next) {
      throw std::invalid_argument(where + ": the bytes of tensor '" + e->name +
                                  "' overlap those of tensor '" + previous->name + "'");
    }
    if (e->begin > next) {
      throw std::invalid_argument(where + ": " + std::to_string(e->begin - next) +
                                  " bytes before tensor '" + e->name +
                                  "' belong to no tensor (offsets must be contiguous)");
    }
    next = e->end;
    previous = e;
  }
  const int64_t data_bytes = file_bytes - header.data_start;
  if (next > data_bytes) {
    throw std::invalid_argument(where + " is truncated: tensor '" + previous->name +
                                "' ends at data byte " + std::to_string(next) +
                                " but the file holds " + std::to_string(data_bytes));
  }
  if (next < data_bytes) {
    throw std::invalid_argument(where + " has " + std::to_string(data_bytes - next) +
                                " bytes after its last tensor that belong to no tensor");
  }
  return header;
}

}  // namespace shardtrain::detail

namespace shardtrain {

std::vector<TensorSpec> read_safetensors_specs(const std::string& path) {
  std::vector<TensorSpec> specs;
  for (const auto& e : detail::read_safetensors_header(path).entries) {
    specs.push_back({e.name, e.shape, e.dtype});
  }
  return specs;
}

}  // namespace shardtrain
