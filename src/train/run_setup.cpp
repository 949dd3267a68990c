#include "train/run_setup.h"

#include <malloc.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace fs = std::filesystem;

namespace shardtrain::detail {
namespace {

int64_t status_field_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string prefix = std::string(field) + ":";
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) return std::stoll(line.substr(prefix.size()));
  }
  return 0;
}

}  // namespace

bool return_memory_promptly(bool state_in_files) {
#ifdef __GLIBC__
  if (!state_in_files || std::getenv("MALLOC_MMAP_MAX_") || std::getenv("MALLOC_TRIM_THRESHOLD_")) {
    return false;
  }
  mallopt(M_MMAP_MAX, 1 << 20);
  mallopt(M_MMAP_THRESHOLD, 4 << 20);
  mallopt(M_TRIM_THRESHOLD, 4 << 20);
  return true;
#else
  (void)state_in_files;
  return false;
#endif
}

void trim_heap() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

int64_t resident_bytes() { return status_field_kib("VmRSS") * 1024; }
int64_t peak_resident_bytes() { return status_field_kib("VmHWM") * 1024; }

LoraOptions lora_options(const TrainConfig& config) {
  return LoraOptions()
      .rank(config.lora.rank)
      .alpha(config.lora.alpha)
      .dropout(config.lora.dropout)
      .target_modules(config.lora.target_modules);
}

}  // namespace shardtrain::detail
