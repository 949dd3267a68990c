#include "checkpoint/sharded_index.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>

#include "checkpoint/safetensors_detail.h"
#include "common/file_error.h"

namespace fs = std::filesystem;

namespace shardtrain::detail {

std::string rank_file_name(int rank) {
  char name[40];
  std::snprintf(name, sizeof(name), "rank_%05d.safetensors", rank);
  return name;
}

nlohmann::json spec_to_json(const TensorSpec& spec) {
  return {{"name", spec.name}, {"shape", spec.shape}, {"dtype", safetensors_dtype(spec.dtype)}};
}

TensorSpec spec_from_json(const nlohmann::json& json) {
  TensorSpec spec;
  spec.name = json.at("name").get<std::string>();
  spec.shape = json_int64s(json.at("shape"), "tensor '" + spec.name + "': shape");
  spec.dtype =
      dtype_from_safetensors(json.at("dtype").get<std::string>(), "tensor '" + spec.name + "'");
  checked_bytes(spec.shape, spec.dtype, "tensor '" + spec.name + "'");
  return spec;
}

nlohmann::json write_rank_file(const std::string& dir, int rank,
                               const std::vector<SliceRef>& slices,
                               const std::function<at::Tensor(size_t)>& fetch,
                               const NamedTensors& rank_state) {
  std::vector<SafetensorsStreamWriter::Entry> entries;
  for (const auto& s : slices) {
    entries.push_back({s.tensor + "@" + std::to_string(s.offset), s.dtype, {s.numel}});
  }
  std::vector<at::Tensor> state_data;
  for (const auto& [name, tensor] : rank_state) {
    state_data.push_back(tensor.detach().to(at::kCPU).contiguous());
    entries.push_back({"rank_state/" + name, tensor.scalar_type(), tensor.sizes().vec()});
  }
  const std::string file = rank_file_name(rank);
  SafetensorsStreamWriter writer((fs::path(dir) / file).string(), entries);
  for (size_t i = 0; i < slices.size(); ++i) {
    const at::Tensor data = fetch(i);
    TORCH_CHECK(data.numel() == slices[i].numel, "slice of '", slices[i].tensor, "' at offset ",
                slices[i].offset, " changed size while it was written");
    writer.write(data.reshape({-1}));
  }
  for (const auto& tensor : state_data) writer.write(tensor);
  const auto written = writer.finish();

  nlohmann::json slice_records = nlohmann::json::array();
  for (size_t i = 0; i < slices.size(); ++i) {
    slice_records.push_back({{"tensor", slices[i].tensor},
                             {"offset", slices[i].offset},
                             {"numel", slices[i].numel},
                             {"byte_range", {written[i].begin, written[i].end}},
                             {"crc32", written[i].crc32}});
  }
  nlohmann::json state_records = nlohmann::json::array();
  for (size_t i = 0; i < rank_state.size(); ++i) {
    const auto& w = written[slices.size() + i];
    state_records.push_back({{"name", rank_state[i].first},
                             {"shape", state_data[i].sizes().vec()},
                             {"dtype", safetensors_dtype(state_data[i].scalar_type())},
                             {"byte_range", {w.begin, w.end}},
                             {"crc32", w.crc32}});
  }
  return {{"name", file},
          {"rank", rank},
          {"bytes", writer.bytes()},
          {"crc32", writer.file_crc32()},
          {"slices", slice_records},
          {"rank_state", state_records}};
}

void write_index(const std::string& dir, const std::vector<TensorSpec>& tensors,
                 const nlohmann::json& layout, const nlohmann::json& metadata,
                 const std::vector<nlohmann::json>& files) {
  std::map<std::string, const TensorSpec*> by_name;
  for (const auto& spec : tensors) {
    if (!by_name.emplace(spec.name, &spec).second) {
      throw std::invalid_argument("checkpoint lists tensor '" + spec.name + "' twice");
    }
  }
  // (offset, numel, rank) of every slice, per tensor.
  std::map<std::string, std::vector<std::array<int64_t, 3>>> cover;
  for (const auto& file : files) {
    for (const auto& slice : file.at("slices")) {
      const std::string name = slice.at("tensor").get<std::string>();
      if (!by_name.count(name)) {
        throw std::invalid_argument("rank " + file.at("rank").dump() +
                                    " saved a slice of tensor '" + name +
                                    "', which is not in the checkpoint's tensor list");
      }
      cover[name].push_back({slice.at("offset").get<int64_t>(), slice.at("numel").get<int64_t>(),
                             file.at("rank").get<int64_t>()});
    }
  }
  for (const auto& spec : tensors) {
    auto& ranges = cover[spec.name];
    std::sort(ranges.begin(), ranges.end());
    int64_t next = 0;
    for (const auto& [offset, numel, rank] : ranges) {
      if (numel == 0) continue;
      if (offset != next) {
        throw std::invalid_argument("the slices of tensor '" + spec.name + "' " +
                                    (offset < next
                                         ? "overlap at element " + std::to_string(offset) +
                                               " (rank " + std::to_string(rank) + ")"
                                         : "leave elements [" + std::to_string(next) + ", " +
                                               std::to_string(offset) + ") unsaved"));
      }
      next = offset + numel;
    }
    if (next != spec.numel()) {
      throw std::invalid_argument("the slices of tensor '" + spec.name + "' cover " +
                                  std::to_string(next) + " of its " + std::to_string(spec.numel()) +
                                  " elements");
    }
  }
  nlohmann::json specs = nlohmann::json::array();
  for (const auto& spec : tensors) specs.push_back(spec_to_json(spec));
  const nlohmann::json index = {{"format", kShardedFormatName},
                                {"version", kShardedFormatVersion},
                                {"layout", layout},
                                {"metadata", metadata},
                                {"tensors", specs},
                                {"files", files}};
  const std::string path = (fs::path(dir) / "index.json").string();
  {
    errno = 0;
    std::ofstream out(path, std::ios::trunc);
    out << index.dump(1) << "\n";
    out.close();
    if (!out) throw std::runtime_error(cannot_write(path));
  }
  fsync_path(path);
}

}  // namespace shardtrain::detail
