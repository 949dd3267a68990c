// What the trainer builds before its loop: process memory reads, LoRA options, the loss, the
// checkpoint's tensors (run_data.h: the tokenizer and the data).
#pragma once

#include <torch/optim/adamw.h>

#include <memory>
#include <string>
#include <utility>

#include "shardtrain/config.h"
#include "shardtrain/data.h"
#include "shardtrain/fsdp.h"
#include "shardtrain/lora.h"
#include "shardtrain/sharded_checkpoint.h"
#include "shardtrain/tokenizer.h"

namespace shardtrain::detail {

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

// The mean cross-entropy of `logits` (the model's output for batch.inputs) against
// batch.targets; under tensor parallelism reduced across the group, never gathered.
at::Tensor logits_loss(Transformer& model, const at::Tensor& logits, const Batch& batch);

struct TpState;

// Whether `value` is true on any rank of `group`. Collective.
bool on_any_rank(ProcessGroup& group, bool value);

// The logical tensors of a trainer checkpoint, in order: every trained parameter under its
// module name (a LoRA run's adapters only), the buffers, then AdamW's state of each parameter
// that has one ("optim.NAME.exp_avg", ".exp_avg_sq", and ".step" as a 0-dim int64), each as the
// full tensor whatever the strategy, so that it reshards like the parameters.
NamedTensors logical_tensors(Transformer& model, const torch::optim::AdamW& optimizer);

// Strategy-specific: the flat slices of `tensors` this rank writes. Replicated strategies
// ("none", "ddp") hold every tensor whole on every one of the `world` ranks that hold it; each
// writes shard_range(numel, world, rank) of each, so that all write in parallel. A tensor split
// by tensor parallelism (`tp`) is held whole by the data-parallel ranks of one group position:
// they share it the same way, and its slices are written as ranges of the whole tensor.
std::vector<FlatSlice> owned_slices(const std::string& strategy, int rank, int world,
                                    const TpState* tp, int dp_rank, int dp_size,
                                    const NamedTensors& tensors);

// LibTorch's optimizers key per-parameter state by the TensorImpl address, printed.
std::string optimizer_state_key(const at::Tensor& parameter);

// A pipeline stage under FSDP/ZeRO: its units gathered for the scope
// (FullyShardedDataParallel::begin_pipeline), freed at its end without reducing anything
// (evaluation, generation, a step that failed) unless reduce_gradients() ended it first.
// Null: nothing.
class GatheredStage {
 public:
  explicit GatheredStage(FullyShardedDataParallel* fsdp) : fsdp_(fsdp) {
    if (fsdp_) fsdp_->begin_pipeline();
  }
  ~GatheredStage() {
    try {
      if (fsdp_) fsdp_->end_pipeline(/*gradients=*/false);
    } catch (const std::exception&) {
      // a gather failed with the group: the error on its way out says so
    }
  }
  // A training step's end: the accumulated gradients reduced. Collective.
  void reduce_gradients() {
    if (FullyShardedDataParallel* fsdp = std::exchange(fsdp_, nullptr)) fsdp->end_pipeline();
  }
  GatheredStage(const GatheredStage&) = delete;
  GatheredStage& operator=(const GatheredStage&) = delete;

 private:
  FullyShardedDataParallel* fsdp_;
};

}  // namespace shardtrain::detail
