// What a LoRA run's adapters were trained on, recorded in its checkpoints, so that a resume on
// another base is refused instead of training the adapters on weights they were not fit to:
// where the base came from (model.init_from, or the seed of a random base) and a fingerprint of
// its files.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "shardtrain/config.h"

namespace shardtrain::detail {

// A fingerprint of the Hugging Face weights at `init_from` (a folder, or one .safetensors
// file): FNV-1a over each weight file's name, size and sampled bytes (its first and last 64 KiB,
// which hold the safetensors header with every tensor's dtype, shape and offsets, and 4 KiB every
// 64 MiB) as 16 hex digits. Reads about a megabyte per gigabyte. Throws std::invalid_argument
// naming a file that cannot be read.
std::string base_fingerprint(const std::string& init_from);

// The base of this config's LoRA run as a checkpoint records it: {"init_from", "fingerprint",
// "seed"} (fingerprint empty and the seed deciding for a random base).
nlohmann::json lora_base(const TrainConfig& config);

// Throws std::invalid_argument when `recorded` (a checkpoint's lora_base(), from checkpoint
// `dir`) is not this config's base, naming both and what to set. A checkpoint written before
// bases were recorded passes.
void check_lora_base(const nlohmann::json& recorded, const TrainConfig& config,
                     const std::string& dir);

}  // namespace shardtrain::detail
