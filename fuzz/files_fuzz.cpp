// The file readers: safetensors, a Hugging Face config.json, a token shard.
#include <algorithm>
#include <stdexcept>

#include "fuzz_target.h"
#include "shardtrain/checkpoint.h"
#include "shardtrain/data.h"
#include "shardtrain/model.h"

namespace shardtrain::fuzz {

int safetensors_header(const uint8_t* data, size_t size) {
  try {
    load_safetensors(input_file("input.safetensors", data, size));
  } catch (const std::invalid_argument&) {
  }
  return 0;
}

int hf_config(const uint8_t* data, size_t size) {
  try {
    model_config_from_hf_json(input_file("config.json", data, size));
  } catch (const std::invalid_argument&) {
  }
  return 0;
}

int token_shard(const uint8_t* data, size_t size) {
  try {
    const TokenShard shard(input_file("input.tokens", data, size));
    if (shard.size() > 0) shard.read(0, std::min<int64_t>(shard.size(), 64));
  } catch (const std::invalid_argument&) {
  }
  return 0;
}

}  // namespace shardtrain::fuzz
