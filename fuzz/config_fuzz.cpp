// The config readers: TOML with --set overrides, DeepSpeed's ds_config.json, accelerate's YAML.
#include <sstream>
#include <stdexcept>
#include <vector>

#include "fuzz_target.h"
#include "shardtrain/config.h"

namespace shardtrain::fuzz {

// The TOML text, then after a line "%%" one --set override per line.
int train_config(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find("\n%%\n");
  std::vector<std::string> overrides;
  if (split != std::string::npos) {
    std::istringstream lines(input.substr(split + 4));
    for (std::string line; std::getline(lines, line);) overrides.push_back(line);
  }
  try {
    parse_train_config(input.substr(0, split), "fuzz.toml", overrides);
  } catch (const std::invalid_argument&) {
  }
  return 0;
}

int deepspeed_config(const uint8_t* data, size_t size) {
  try {
    deepspeed_overrides_from_json(std::string(reinterpret_cast<const char*>(data), size),
                                  "ds_config.json", 4);
  } catch (const std::invalid_argument&) {
  }
  return 0;
}

int accelerate_config(const uint8_t* data, size_t size) {
  try {
    accelerate_overrides_from_yaml(std::string(reinterpret_cast<const char*>(data), size),
                                   "accelerate.yaml", 2);
  } catch (const std::invalid_argument&) {
  }
  return 0;
}

}  // namespace shardtrain::fuzz
