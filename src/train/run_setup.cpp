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

void apply_global_batch(TrainConfig& config, int dp_size) {
  TrainSection& train = config.train;
  if (train.global_batch == 0) return;
  const int64_t per_accumulation = train.micro_batch * dp_size;
  const std::string ranks = std::to_string(dp_size) + " data-parallel rank" +
                            (dp_size == 1 ? "" : "s") +
                            " with train.micro_batch = " + std::to_string(train.micro_batch);
  if (train.global_batch % per_accumulation != 0) {
    const int64_t lower = train.global_batch / per_accumulation * per_accumulation;
    throw std::invalid_argument(
        "train.global_batch = " + std::to_string(train.global_batch) + " cannot be kept on " +
        ranks + ": it must be a multiple of micro_batch x data-parallel ranks = " +
        std::to_string(per_accumulation) +
        " (the nearest: " + (lower > 0 ? std::to_string(lower) + " or " : std::string()) +
        std::to_string(lower + per_accumulation) + "), or change train.micro_batch");
  }
  const int64_t accumulation = train.global_batch / per_accumulation;
  if (train.grad_accum > 1 && train.grad_accum != accumulation) {
    throw std::invalid_argument(
        "train.grad_accum = " + std::to_string(train.grad_accum) +
        " (or parallel.pp_microbatches) " + "disagrees with train.global_batch = " +
        std::to_string(train.global_batch) + " on " + ranks + ", which needs " +
        std::to_string(accumulation) + " micro-batches per step: set one of them");
  }
  train.grad_accum = accumulation;
  if (config.parallel.pp_microbatches != 0) config.parallel.pp_microbatches = accumulation;
}

}  // namespace shardtrain::detail
