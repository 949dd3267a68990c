// Private pieces of the sharded checkpoint shared by the collective save and offline resharding:
// writing one rank's file and writing index.json after checking that the slices of all files
// cover every tensor exactly once.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "shardtrain/sharded_checkpoint.h"

namespace shardtrain::detail {

constexpr int kShardedFormatVersion = 1;
constexpr const char* kShardedFormatName = "shardtrain.sharded_checkpoint";

// "rank_00003.safetensors"
std::string rank_file_name(int rank);

nlohmann::json spec_to_json(const TensorSpec& spec);
TensorSpec spec_from_json(const nlohmann::json& json);

// What a rank file holds, before its data is fetched.
struct SliceRef {
  std::string tensor;
  int64_t offset = 0;
  int64_t numel = 0;
  at::ScalarType dtype = at::kFloat;
};

// Writes DIR/rank_RRRRR.safetensors: every slice as a 1-D tensor keyed "TENSOR@OFFSET", then the
// rank state keyed "rank_state/NAME"; `fetch(i)` returns the data of slices[i] when it is
// written (so a caller can stream them). fsyncs the file and returns its index.json record.
nlohmann::json write_rank_file(const std::string& dir, int rank,
                               const std::vector<SliceRef>& slices,
                               const std::function<at::Tensor(size_t)>& fetch,
                               const NamedTensors& rank_state);

// Checks that the slices listed in `files` cover each of `tensors` exactly once with its dtype
// (std::invalid_argument naming the tensor otherwise), then writes DIR/index.json and fsyncs it.
void write_index(const std::string& dir, const std::vector<TensorSpec>& tensors,
                 const nlohmann::json& layout, const nlohmann::json& metadata,
                 const std::vector<nlohmann::json>& files);

}  // namespace shardtrain::detail
