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

// Applies run.freed_memory: large CPU blocks that tensors free are cached for the next step
// (set_cpu_block_cache, shardtrain/memory.h) or returned to the kernel at once. "auto" returns
// them when ZeRO keeps state in files (keeps_state_in_files, parallelize.h): what bounds memory
// there is the units in flight, not the page faults of the next step. Returning also has glibc
// serve its own blocks over 4 MiB by mmap and unmap them when freed, unless the user set
// MALLOC_MMAP_MAX_ or MALLOC_TRIM_THRESHOLD_. Returns whether freed memory is returned.
bool apply_freed_memory(const TrainConfig& config);
// Hands free heap pages back to the system (glibc's malloc_trim); a no-op elsewhere.
void trim_heap();

// train.global_batch at `dp_size` data-parallel ranks: sets train.grad_accum to
// global_batch / (micro_batch x dp_size). Throws std::invalid_argument naming the numbers when
// the global batch is not a multiple of micro_batch x dp_size, or when a train.grad_accum (or
// parallel.pp_microbatches) above 1 was set to another value. Nothing without global_batch.
void apply_global_batch(TrainConfig& config, int dp_size);

// The [lora] section as add_lora's options.
LoraOptions lora_options(const TrainConfig& config);

}  // namespace shardtrain::detail
