// One FSDP unit: the flat parameter of a group of blocks (or the root's leftovers), its shards,
// and where its gathered copy stands.
#pragma once

#include <ATen/ATen.h>

#include <future>
#include <memory>
#include <string>
#include <vector>

#include "model/init.h"
#include "optim/io_thread.h"
#include "optim/swap_file.h"
#include "shardtrain/fsdp.h"

namespace shardtrain {

struct FullyShardedDataParallel::Unit {
  std::string name;  // "blocks.0", "blocks.0-1" or "root"
  int index = 0;     // forward order; the root is last
  bool root = false;
  // Parameters that take no gradient (requires_grad false: a LoRA base). A unit of only those
  // is `frozen`; they never share a flat parameter with trained ones, nor with frozen ones of
  // another dtype: those go to `companion`, a frozen unit of its own (which may have a companion
  // in turn) that is gathered and released with this one. A frozen unit has no gradient shard,
  // is never reduced and gives the optimizer nothing, so gradient traffic and optimizer state
  // cover only what trains.
  bool frozen = false;
  std::unique_ptr<Unit> companion;
  // Where its flat parameter is sharded and reduced: the mesh's groups, or under expert
  // parallelism the expert mesh's for a block's experts (a trained companion of the block).
  const Groups* groups = nullptr;
  std::vector<torch::nn::Module*> modules;  // the hook points it covers (none for the root)
  std::vector<at::Tensor> params;           // the model's parameters, views into `full`
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<int64_t> offsets;  // of each parameter in the flat parameter
  int64_t numel = 0;             // sum of the parameters
  int64_t padded = 0;            // numel rounded up to a multiple of the shard group size
  int64_t shard_numel = 0;       // padded / shard group size

  at::Tensor master;      // fp32 [shard_numel]: this rank's shard, what the optimizer updates
  at::Tensor wire;        // what the all-gather sends: master, or its param_dtype copy
  at::Tensor grad_shard;  // fp32 [shard_numel]
  at::Tensor full;        // param_dtype [padded]; its storage's memory exists only while gathered
  bool aliased = false;   // full is master itself: one rank holds everything in fp32
  bool master_in_full = false;  // ZeRO-1/2 in fp32: master is this rank's slice of full
  at::Tensor grad_full;         // ZeRO-1: the whole averaged gradient; grad_shard is a slice of it
  // ZeRO-1 in fp32: the parameters' .grad are views into grad_full, so backward accumulates
  // there and the all-reduce runs on it in place (no copy in, no add out).
  bool grads_in_full = false;
  bool gathered = false;  // memory allocated (the gather may still be in flight)
  WorkHandle gather_work;
  at::Tensor gather_input;  // what the gather in flight sends, kept alive until it completes

  // param_swap_dir: the master shard's file. When not loaded by load_shards() the file is
  // current and the master's memory exists only while a gather reads it.
  std::unique_ptr<detail::SwapFile> swap;
  bool master_resident = true;
  bool held = false;            // loaded by load_shards(), until store_shards()
  std::future<void> master_io;  // the master shard's transfer on the I/O thread, if any

  // grad_swap_dir: the gradient shard's file; its memory exists only while a reduction adds
  // into it or load_shards() holds it.
  std::unique_ptr<detail::SwapFile> grad_swap;
  bool grad_resident = true;
  bool grad_held = false;
  bool grad_zero = false;     // zeroed since the file was last written: the file is stale
  at::Tensor grad_squares;    // fp64 sum of squares of the shard as last written
  bool grad_finite = true;    // and whether it was finite
  double grad_factor = 1.0;   // clip_grad_norm's scaling, applied when the shard is read
  std::future<void> grad_io;  // the gradient shard's transfer on the I/O thread, if any
  bool grad_in_file() const { return grad_swap && !grad_resident; }

  // Per backward.
  bool in_backward = false;
  bool reduced = false;
  size_t ready = 0;
  std::vector<bool> ready_flags;
  struct PendingReduce {
    at::Tensor output;  // reduce_dtype, this rank's shard of the averaged gradient
    WorkHandle scatter;
    WorkHandle replicate;
  };
  std::vector<PendingReduce> pending;
  // The per-backward flags back to their state before a backward (at its end, or after one
  // that failed).
  void end_backward() {
    in_backward = false;
    reduced = false;
    ready = 0;
    ready_flags.assign(params.size(), false);
  }

  int64_t full_bytes() const {
    return aliased ? 0 : padded * static_cast<int64_t>(full.element_size());
  }
};

namespace detail {
// Queues on `io` a write of the whole of `shard` to the start of `file`. The memory leaves the
// tensor with the job (the tensor then holds none, as after release_storage) and is freed when
// the write ends.
std::future<void> write_behind(IoThread& io, const SwapFile& file, const at::Tensor& shard);

// Elements of the module's parameters (its submodules' included).
int64_t parameter_count(const torch::nn::Module& module);

// Groups of hook points (indices), one per unit, as the policy decides; throws
// std::invalid_argument for a policy that makes no unit.
std::vector<std::vector<size_t>> plan_units(
    const std::vector<std::shared_ptr<torch::nn::Module>>& points, const WrapPolicy& policy);
}  // namespace detail

}  // namespace shardtrain
