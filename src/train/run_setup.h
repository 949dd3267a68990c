// What the trainer builds before its loop: the tokenizer, the token shard, process memory reads.
#pragma once

#include <memory>
#include <string>

#include "shardtrain/config.h"
#include "shardtrain/data.h"
#include "shardtrain/lora.h"
#include "shardtrain/tokenizer.h"

namespace shardtrain::detail {

// "byte", or "gpt2" from data.gpt2_dir (default_gpt2_dir() when empty).
std::unique_ptr<Tokenizer> make_tokenizer(const TrainConfig& config);

// data.corpus when it is one token shard (opened and its header checked), else null after
// checking that every text input exists. Writes nothing.
std::shared_ptr<TokenShard> open_token_shard_corpus(const TrainConfig& config);

// data.corpus as a token shard: used directly when it is one, else tokenized once into
// RUN_DIR/corpus.tokens (re-made when the inputs or the tokenizer change).
std::shared_ptr<TokenShard> open_corpus(const TrainConfig& config, const Tokenizer& tokenizer);

// Resident and peak-resident memory of this process, bytes (Linux /proc/self/status).
int64_t resident_bytes();
int64_t peak_resident_bytes();

// With ZeRO's state in files, what bounds memory is the units in flight, so freed blocks must
// go back to the system at once: large blocks are served by mmap and unmapped on free (glibc),
// instead of the heap that cli/main.cpp keeps for speed, whose freed pages stay resident.
// Nothing happens without offload to files, or when the user set MALLOC_MMAP_MAX_ or
// MALLOC_TRIM_THRESHOLD_. Returns whether it changed the allocator's settings.
bool return_memory_promptly(const TrainConfig& config);
// Hands free heap pages back to the system (glibc's malloc_trim); a no-op elsewhere.
void trim_heap();

// The [lora] section as add_lora's options.
LoraOptions lora_options(const TrainConfig& config);

// LibTorch's optimizers key per-parameter state by the TensorImpl address, printed.
std::string optimizer_state_key(const at::Tensor& parameter);

}  // namespace shardtrain::detail
