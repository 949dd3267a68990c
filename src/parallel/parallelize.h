// The parallelize step: the trainer describes the model, then applies its parallelisms here in
// one written order, each strategy contributing one apply_* function from its own folder.
#pragma once

#include <memory>
#include <optional>

#include "parallel/parallel_model.h"
#include "shardtrain/config.h"
#include "shardtrain/ddp.h"
#include "shardtrain/fsdp.h"
#include "shardtrain/mesh.h"
#include "shardtrain/model.h"
#include "shardtrain/pipeline.h"
#include "shardtrain/tensor_parallel.h"
#include "shardtrain/zero.h"

namespace shardtrain {

// What only a strategy's own rules can judge, checked before anything is allocated or written:
// today the pipeline's stages (parallel.pp_split against the model's blocks) and its schedule
// (against the micro-batches per step). Throws std::invalid_argument naming the settings.
void check_parallel_settings(const TrainConfig& config);

// Applies config's parallelisms to `model`, in this order (torchtitan's), and returns the one
// object the trainer drives (ParallelModel):
//   0. pipeline parallelism: `model` holds this rank's stages already (built with
//      ModelInit::parts(pipeline_parts(...)), since a stage never builds the other stages' parts);
//      apply_pp, last, runs them by the schedule around the stage's data-parallel step;
//   1. tensor parallelism (apply_tp, parallel.tp) on the mesh's tp axis;
//   2. context parallelism (apply_cp, parallel.cp) on the mesh's cp axis, expert parallelism
//      (apply_ep, parallel.ep) on its ep groups (the model then holds this rank's experts,
//      built with limit_to_own_parts);
//   3. activation checkpointing, per block, and the attention kernel;
//   4. one data-parallel step on the mesh's data-parallel ranks with cp folded in
//      (DeviceMesh::data_parallel_mesh), the experts' parameters on the expert mesh
//      (DeviceMesh::expert_mesh): apply_fsdp, apply_zero, or apply_ddp (replicated: "ddp", and
//      "none");
//   5. materialization: a sharded step allocates and initializes only this rank's shards of a
//      deferred model; every other path materializes the whole model.
// `model` may be deferred (ModelInit().deferred()). `mesh` is the trainer's mesh over `world`
// (train_mesh_shape), built before the model; both null for one process. Collective over
// `world`. Throws std::invalid_argument for settings a strategy refuses, naming them.
std::unique_ptr<ParallelModel> parallelize(Transformer& model, const TrainConfig& config,
                                           const std::shared_ptr<ProcessGroup>& world,
                                           const DeviceMesh* mesh);

// Before the mesh and the model: whether config's data-parallel step runs on a process group
// even on one process (FSDP and ZeRO: their sharding, policy and accounting), and whether the
// data-parallel ranks `shape` gives (of `world_size`) have a strategy that uses them; throws
// std::invalid_argument naming the setting otherwise.
bool runs_on_a_group(const TrainConfig& config);
void check_data_parallel_ranks(const TrainConfig& config, const MeshShape& shape, int world_size);
// Before the run directory is touched: the sizes tensor parallelism splits (the vocabulary,
// described as `vocabulary` in the message, the heads, key/value heads and the FFN width)
// divide by parallel.tp. Throws std::invalid_argument naming them.
void check_tp_sizes(const TrainConfig& config, const std::string& vocabulary);
// Whether the run keeps state in files (ZeRO's offload to nvme): memory is then bounded by the
// units in flight and should go back to the system at once.
bool keeps_state_in_files(const TrainConfig& config);
// What pipeline rank `pp_rank`, expert-parallel rank `ep_rank` builds of the model: its stages
// only, and of each mixture-of-experts block its experts only (nothing changes for
// parallel.pp = 1 and parallel.ep = 1).
void limit_to_own_parts(ModelInit& init, const TrainConfig& config, int pp_rank, int ep_rank);

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

// The steps, each taking the options it uses. apply_pp: the stage's model `stage` run by
// `schedule` on the mesh's pp axis, `blocks` every stage's blocks (`stage` itself for pp = 1).
std::unique_ptr<ParallelModel> apply_pp(std::unique_ptr<ParallelModel> stage, Transformer& model,
                                        PipelineSchedule schedule,
                                        std::vector<std::pair<int64_t, int64_t>> blocks,
                                        bool split_backward,
                                        const std::shared_ptr<ProcessGroup>& world,
                                        const DeviceMesh& mesh);
// Splits the model's layers across the mesh's tp axis (transformer_tp_plan).
void apply_tp(Transformer& model, TensorParallelOptions options, const DeviceMesh& mesh);
void apply_activation_checkpointing(Transformer& model, bool enabled);
// Splits the model's sequences across the mesh's cp axis, attention by ring (a no-op for cp = 1).
void apply_cp(Transformer& model, const DeviceMesh& mesh);
// The kernel train.attention names, "auto" resolved; and its name.
AttentionKernel attention_kernel(const TrainConfig& config);
std::string attention_kernel_name(const TrainConfig& config);
// The replicated step: the whole model materialized on every data-parallel rank, and DDP
// over them when `ddp` has options and there are several.
std::unique_ptr<ParallelModel> apply_ddp(Transformer& model, std::optional<DDPOptions> ddp,
                                         const std::shared_ptr<ProcessGroup>& world,
                                         const DeviceMesh* mesh);
// FSDP on the mesh's dp_replicate x dp_shard axes.
std::unique_ptr<ParallelModel> apply_fsdp(Transformer& model, FSDPOptions options,
                                          const std::shared_ptr<ProcessGroup>& world,
                                          const DeviceMesh& mesh);
// ZeRO over the mesh's data-parallel ranks.
std::unique_ptr<ParallelModel> apply_zero(Transformer& model, ZeroOptions options,
                                          const std::shared_ptr<ProcessGroup>& world,
                                          const DeviceMesh& mesh);

// The config's settings as each step's options, next to the step that takes them: parallel.ddp.*
// (none for parallel.strategy "none"), parallel.fsdp.* and parallel.zero.* with precision.*.
std::optional<DDPOptions> ddp_options(const TrainConfig& config);
FSDPOptions fsdp_options(const TrainConfig& config);
ZeroOptions zero_options(const TrainConfig& config);

// precision.param_dtype, reduce_dtype and buffer_dtype ("bf16" or "fp32").
MixedPrecision mixed_precision_of(const TrainConfig& config);

}  // namespace shardtrain
