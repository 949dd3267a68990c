#include "train/lora_base.h"

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <vector>

#include "shardtrain/hf.h"

namespace shardtrain::detail {
namespace {

constexpr uint64_t kFnvOffset = 1469598103934665603ULL;
constexpr uint64_t kFnvPrime = 1099511628211ULL;

void mix(uint64_t& hash, const char* data, size_t size) {
  for (size_t i = 0; i < size; ++i) {
    hash ^= static_cast<unsigned char>(data[i]);
    hash *= kFnvPrime;
  }
}

// `size` bytes at `offset` of an open file into the hash (fewer at the end of the file).
void mix_range(uint64_t& hash, std::ifstream& in, int64_t offset, int64_t size) {
  std::vector<char> buffer(static_cast<size_t>(size));
  in.clear();
  in.seekg(offset);
  in.read(buffer.data(), size);
  mix(hash, buffer.data(), static_cast<size_t>(in.gcount()));
}

}  // namespace

std::string base_fingerprint(const std::string& init_from) {
  if (init_from.empty()) return "";
  constexpr int64_t kEnds = 64 << 10, kSample = 4 << 10, kStride = int64_t{64} << 20;
  uint64_t hash = kFnvOffset;
  for (const std::string& file : hf_weight_files(init_from)) {
    std::error_code error;
    const auto size = static_cast<int64_t>(std::filesystem::file_size(file, error));
    std::ifstream in(file, std::ios::binary);
    if (error || !in) {
      throw std::invalid_argument("LoRA base: cannot read '" + file + "' to fingerprint it");
    }
    const std::string name =
        std::filesystem::path(file).filename().string() + ":" + std::to_string(size);
    mix(hash, name.data(), name.size());
    mix_range(hash, in, 0, std::min(kEnds, size));
    for (int64_t at = kStride; at + kSample < size; at += kStride) mix_range(hash, in, at, kSample);
    if (size > kEnds) mix_range(hash, in, size - kEnds, kEnds);
  }
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

nlohmann::json lora_base(const TrainConfig& config) {
  return {{"init_from", config.model.init_from},
          {"fingerprint", base_fingerprint(config.model.init_from)},
          {"seed", config.train.seed}};
}

void check_lora_base(const nlohmann::json& recorded, const TrainConfig& config,
                     const std::string& dir) {
  if (!recorded.is_object() || !recorded.contains("fingerprint")) return;
  const std::string was = recorded.value("init_from", std::string());
  const std::string prefix = "checkpoint '" + dir + "' holds LoRA adapters trained on ";
  if (was.empty()) {
    const auto seed = recorded.value("seed", int64_t{0});
    if (!config.model.init_from.empty()) {
      throw std::invalid_argument(prefix + "a random base (train.seed " + std::to_string(seed) +
                                  "), but model.init_from is '" + config.model.init_from +
                                  "': unset model.init_from to resume it");
    }
    if (seed != config.train.seed) {
      throw std::invalid_argument(prefix + "a random base drawn with train.seed " +
                                  std::to_string(seed) + ", but train.seed is " +
                                  std::to_string(config.train.seed) +
                                  ": set train.seed = " + std::to_string(seed) + " to resume it");
    }
    return;
  }
  if (config.model.init_from.empty()) {
    throw std::invalid_argument(prefix + "the base '" + was +
                                "', but model.init_from is not set (the base would be random): "
                                "set model.init_from = \"" +
                                was + "\"");
  }
  const std::string fingerprint = base_fingerprint(config.model.init_from);
  if (fingerprint != recorded.value("fingerprint", std::string())) {
    throw std::invalid_argument(prefix + "the base '" + was + "' (fingerprint " +
                                recorded.value("fingerprint", std::string()) +
                                "), but the weights in model.init_from '" + config.model.init_from +
                                "' are other ones (fingerprint " + fingerprint +
                                "): point model.init_from at the base it was trained on");
  }
}

}  // namespace shardtrain::detail
