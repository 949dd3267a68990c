#include "train/run_setup.h"

#include <malloc.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "parallel/parallelize.h"
#include "shardtrain/memory.h"

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

bool apply_freed_memory(const TrainConfig& config) {
  const std::string& choice = config.run.freed_memory;
  const bool give_back = choice == "return" || (choice == "auto" && keeps_state_in_files(config));
  set_freed_memory(choice == "malloc" ? FreedMemory::kMalloc
                   : give_back        ? FreedMemory::kReturn
                                      : FreedMemory::kCache);
#ifdef __GLIBC__
  if (give_back && !std::getenv("MALLOC_MMAP_MAX_") && !std::getenv("MALLOC_TRIM_THRESHOLD_")) {
    mallopt(M_MMAP_MAX, 1 << 20);
    mallopt(M_MMAP_THRESHOLD, 4 << 20);
    mallopt(M_TRIM_THRESHOLD, 4 << 20);
  }
#endif
  return give_back;
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
