// What the trainer builds before its loop: process memory reads, the heap's settings, LoRA's
// options (run_data.h: the tokenizer and the data).
#pragma once

#include <torch/optim/adamw.h>

#include <memory>
#include <string>
#include <utility>

#include "shardtrain/config.h"
#include "shardtrain/data.h"
#include "shardtrain/lora.h"
#include "shardtrain/sharded_checkpoint.h"
#include "shardtrain/tokenizer.h"

namespace shardtrain::detail {

// Resident and peak-resident memory of this process, bytes (Linux /proc/self/status).
int64_t resident_bytes();
int64_t peak_resident_bytes();

// With state in files (keeps_state_in_files, parallelize.h), what bounds memory is the units in
// flight, so freed blocks must go back to the system at once: large blocks are served by mmap
// and unmapped on free (glibc), instead of the heap that cli/main.cpp keeps for speed, whose
// freed pages stay resident. Nothing happens when `state_in_files` is false, or when the user
// set MALLOC_MMAP_MAX_ or MALLOC_TRIM_THRESHOLD_. Returns whether it changed the allocator's
// settings.
bool return_memory_promptly(bool state_in_files);
// Hands free heap pages back to the system (glibc's malloc_trim); a no-op elsewhere.
void trim_heap();

// The [lora] section as add_lora's options.
LoraOptions lora_options(const TrainConfig& config);

}  // namespace shardtrain::detail
