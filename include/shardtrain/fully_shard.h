// FSDP for any torch::nn::Module, per parameter (PyTorch's FSDP2 `fully_shard`): every
// parameter of a sharded module is split on dim 0 across the mesh's dp_shard ranks, gathered
// just before the module computes and freed after, and its gradient reduce-scattered back to
// the shards. Applied to each block and then to the root, as torchtitan's apply_fsdp does.
//
//   auto mesh = DeviceMesh(world, resolve_mesh(MeshShape(), world->size()));
//   for (auto& block : model->blocks) shardtrain::fully_shard(block.ptr(), mesh);
//   auto root = shardtrain::fully_shard(model.ptr(), mesh);
//   torch::optim::AdamW opt(root->parameters(), ...);   // the dim-0 shards
//   // in the module's forward: x = shardtrain::call(block, x);  (see call() below)
//
// The module's own parameters keep their full shape and the compute dtype for the life of the
// module (autograd saves them for backward by identity, so they cannot change shape); their
// memory exists only while their module is gathered. The optimizer, clipping and checkpoints
// work on the shards that FSDPModule::parameters() returns instead: ordinary leaf tensors of
// shape [ceil(d0 / N) or fewer rows, ...] whose .grad() holds the averaged gradient.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "shardtrain/fsdp.h"
#include "shardtrain/mesh.h"
#include "shardtrain/model.h"
#include "shardtrain/sharded_checkpoint.h"

namespace shardtrain {

struct FullyShardOptions {
  // true (full_shard, ZeRO-3): the parameters are freed after the module's forward and
  // gathered again for its backward. false (shard_grad_op, ZeRO-2): they stay gathered from
  // the forward to the end of the backward. The root stays gathered through backward either way.
  FullyShardOptions& reshard_after_forward(bool value) {
    reshard_after_forward_ = value;
    return *this;
  }
  // Gathered parameters in param_dtype, gradients reduced in reduce_dtype, buffers cast to
  // buffer_dtype; the shards (what the optimizer updates) stay fp32.
  FullyShardOptions& mixed_precision(MixedPrecision value) {
    mixed_precision_ = value;
    return *this;
  }
  // DeepSpeed's stages on the same machinery: 3 = reshard_after_forward(true); 2 =
  // reshard_after_forward(false); 1 = as 2, but the whole gradient is all-reduced and each rank
  // keeps its rows of it. 0: as the other options say.
  FullyShardOptions& zero_stage(int value) {
    zero_stage_ = value;
    return *this;
  }
  // Keeps the shards and their gradients in host memory. For CPU parameters they are there
  // already; for CUDA parameters fully_shard refuses it (std::invalid_argument): the copies
  // around each gather and reduction are not implemented.
  FullyShardOptions& cpu_offload(bool value) {
    cpu_offload_ = value;
    return *this;
  }
  // Start every rank from rank 0's parameter and buffer values (a broadcast at construction).
  // Parameters without memory (a deferred module) are filled by `init` instead.
  FullyShardOptions& sync_module_states(bool value) {
    sync_module_states_ = value;
    return *this;
  }
  // How parameters without memory (ModelInit().deferred()) get their values: called with the
  // parameter's name relative to the sharded module, the first flat element and the shard's
  // elements to fill. Each rank fills only its own rows.
  FullyShardOptions& init(ParameterInitializer value) {
    init_ = std::move(value);
    return *this;
  }

  bool reshard_after_forward_ = true;
  MixedPrecision mixed_precision_;
  int zero_stage_ = 0;
  bool cpu_offload_ = false;
  bool sync_module_states_ = true;
  ParameterInitializer init_;
};

// Where one sharded parameter's shard sits in the full tensor.
struct ShardedParameter {
  std::string name;            // relative to the module fully_shard was applied to
  std::vector<int64_t> shape;  // the full parameter's
  int64_t row_begin = 0;       // the shard holds rows [row_begin, row_begin + local.size(0))
  at::Tensor local;            // the shard: a leaf (fp32), .grad() the averaged gradient shard
};

namespace detail {
class ShardGroup;
}

// The handle fully_shard returns, one per sharded module. The sharding lasts as long as the
// module (a handle may be dropped: the module's parent, or the module itself, keeps it).
class FSDPModule {
 public:
  ~FSDPModule();
  FSDPModule(const FSDPModule&) = delete;
  FSDPModule& operator=(const FSDPModule&) = delete;

  torch::nn::Module& module() const;
  // The shards of this module's parameters and (recurse) of every sharded module inside it,
  // forward order of construction: what the optimizer takes. Shards of frozen parameters
  // (requires_grad false) are included and never receive a gradient.
  std::vector<at::Tensor> parameters(bool recurse = true) const;
  std::vector<ShardedParameter> sharded_parameters(bool recurse = true) const;

  // Gathers this module's parameters now (collective over dp_shard). With async the gather is
  // only issued; the module's next forward (or wait_for_unshard) completes it.
  void unshard(bool async = false);
  void wait_for_unshard();
  // Frees the gathered parameters (local; a no-op when not gathered).
  void reshard();

  // false: backward passes keep the whole gradients in the module's parameters and reduce
  // nothing (gradient accumulation without communication); the next backward with true reduces
  // the sum. Applies to this module and every sharded module inside it.
  void set_requires_gradient_sync(bool value);
  // false: parameters stay gathered after backward (for the next micro-batch); set it back to
  // true for the last micro-batch, whose backward then frees them (the step makes them stale).
  void set_reshard_after_backward(bool value);
  // Explicit prefetching (FSDP2's set_modules_to_{forward,backward}_prefetch): when this module's
  // forward (backward) starts, the gathers of these modules are issued. Without a backward list,
  // backward prefetches the module that ran before this one in forward.
  void set_modules_to_forward_prefetch(std::vector<std::shared_ptr<FSDPModule>> modules);
  void set_modules_to_backward_prefetch(std::vector<std::shared_ptr<FSDPModule>> modules);

  // Global L2 norm of the gradient shards of this module and those inside it (fp64; collective
  // over the mesh's dp_shard ranks); with max_norm > 0 the shards are scaled so that it is at
  // most max_norm.
  double clip_grad_norm(double max_norm);
  // The full value of every parameter (sharded ones gathered, fp32) and buffer, names relative
  // to this module. Collective over dp_shard.
  std::vector<std::pair<std::string, at::Tensor>> full_state_dict();
  // For save_sharded_checkpoint: every parameter (fp32, full shape) and buffer, and the slices
  // this rank holds (one dp_replicate replica writes parameters; rank 0 the buffers).
  std::pair<std::vector<TensorSpec>, std::vector<FlatSlice>> checkpoint_slices() const;
  // Fills this rank's shards and the buffers from a checkpoint of the same module saved at any
  // world size; throws std::invalid_argument naming a tensor missing or of another shape.
  void load_checkpoint(const ShardedCheckpointReader& reader);

 private:
  friend std::shared_ptr<FSDPModule> fully_shard(std::shared_ptr<torch::nn::Module>,
                                                 const DeviceMesh&, FullyShardOptions);
  explicit FSDPModule(std::shared_ptr<detail::ShardGroup> group);
  // Also the hooks the module's calls run (shared with the hook table while attached).
  std::shared_ptr<detail::ShardGroup> group_;
};

// Shards `module`'s parameters that no sharded module inside it holds already, per parameter on
// dim 0 over the mesh's dp_shard axis (padding the last rows); with dp_replicate > 1 the shards
// are replicated across it and gradients averaged over both (hybrid sharding). Collective over
// the mesh's data-parallel ranks; every rank calls it for the same modules in the same order.
// Apply it to the children first, then to their parent. The module's forward must be called
// through shardtrain::call (LibTorch has no forward hooks). Throws std::invalid_argument for a
// module with no parameters, one sharded already, one inside a module sharded already, and a
// parameter shared with a module sharded separately, naming them.
std::shared_ptr<FSDPModule> fully_shard(std::shared_ptr<torch::nn::Module> module,
                                        const DeviceMesh& mesh, FullyShardOptions options = {});

}  // namespace shardtrain
