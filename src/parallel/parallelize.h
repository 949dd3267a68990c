// The parallelize step: the trainer describes the model, then applies its parallelisms here in
// one written order, each strategy contributing one apply_* function from its own folder.
#pragma once

#include <memory>

#include "shardtrain/config.h"
#include "shardtrain/ddp.h"
#include "shardtrain/fsdp.h"
#include "shardtrain/mesh.h"
#include "shardtrain/model.h"
#include "shardtrain/pipeline.h"

namespace shardtrain {
namespace detail {
class PipelineRunner;
}

// What parallelize() made of a model: at most one data-parallel wrapper (none for strategy
// "none", or DDP on one data-parallel rank), and the pipeline's runner.
struct Parallelized {
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<FullyShardedDataParallel> sharded;  // fsdp, or zero at any stage
  std::unique_ptr<detail::PipelineRunner> pipeline;   // parallel.pp > 1
  Parallelized();
  Parallelized(Parallelized&&) noexcept;
  ~Parallelized();
};

// What only a strategy's own rules can judge, checked before anything is allocated or written:
// today the pipeline's stages (parallel.pp_split against the model's blocks) and its schedule
// (against the micro-batches per step). Throws std::invalid_argument naming the settings.
void check_parallel_settings(const TrainConfig& config);

// Applies config's parallelisms to `model`, in this order (torchtitan's):
//   0. pipeline parallelism: `model` holds this rank's stages already (built with
//      ModelInit::parts(pipeline_parts(...)), since a stage never builds the other stages' parts);
//      apply_pp, last, gives it the schedule's runner on the mesh's pp axis;
//   1. tensor parallelism (apply_tp, parallel.tp) on the mesh's tp axis;
//   2. activation checkpointing, per block;
//   3. one data-parallel step on the mesh's data-parallel ranks: apply_ddp, apply_fsdp or
//      apply_zero;
//   4. materialization: a sharded step allocates and initializes only this rank's shards of a
//      deferred model; every other path materializes the whole model.
// `model` may be deferred (ModelInit().deferred()). `mesh` is the trainer's mesh over `world`
// (train_mesh_shape), built before the model; both null for one process. Collective over
// `world`. Throws std::invalid_argument for settings a strategy refuses, naming them.
Parallelized parallelize(Transformer& model, const TrainConfig& config,
                         const std::shared_ptr<ProcessGroup>& world, const DeviceMesh* mesh);

// The trainer's mesh over `world_size` ranks: pp = parallel.pp outermost, tp = parallel.tp
// innermost, dp_replicate from hybrid_shard's parallel.fsdp.replicate (0: one replica per node
// of `ranks_per_node` ranks, ProcessGroup::ranks_per_node; 0 there means not known), dp_shard
// the ranks left over. Throws std::invalid_argument naming the sizes when they do not divide
// the world.
MeshShape train_mesh_shape(const TrainConfig& config, int world_size, int ranks_per_node);

// The blocks of every pipeline stage (parallel.pp x pp_virtual_stages, pp_split), and the
// parts of the model pipeline rank `pp_rank` builds: stages pp_rank, pp_rank + pp, ...
std::vector<std::pair<int64_t, int64_t>> pipeline_blocks(const TrainConfig& config);
// The schedule every pipeline rank runs (parallel.pp_schedule over train.grad_accum
// micro-batches).
PipelineSchedule pipeline_schedule(const TrainConfig& config);
ModelParts pipeline_parts(const TrainConfig& config, int pp_rank);

// The steps, each a no-op when its setting is off.
// The schedule's runner on the mesh's pp axis (null for pp = 1).
std::unique_ptr<detail::PipelineRunner> apply_pp(Transformer& model, const TrainConfig& config,
                                                 const DeviceMesh& mesh);
// Splits the model's layers across the mesh's tp axis (transformer_tp_plan).
void apply_tp(Transformer& model, const TrainConfig& config, const DeviceMesh& mesh);
void apply_activation_checkpointing(Transformer& model, const TrainConfig& config);
// DDP over the data-parallel ranks `dp` (materializes the model first).
std::unique_ptr<DistributedDataParallel> apply_ddp(Transformer& model, const TrainConfig& config,
                                                   const std::shared_ptr<ProcessGroup>& dp);
// FSDP (parallel.fsdp.*) on the mesh's dp_replicate x dp_shard axes, stored in `out`.
void apply_fsdp(Transformer& model, const TrainConfig& config, const DeviceMesh& mesh,
                Parallelized& out);
// ZeRO (parallel.zero.*) over the mesh's data-parallel ranks, stored in `out`.
void apply_zero(Transformer& model, const TrainConfig& config, const DeviceMesh& mesh,
                Parallelized& out);

// precision.param_dtype, reduce_dtype and buffer_dtype ("bf16" or "fp32").
MixedPrecision mixed_precision_of(const TrainConfig& config);

}  // namespace shardtrain
