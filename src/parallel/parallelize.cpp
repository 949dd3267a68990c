#include "parallel/parallelize.h"

#include <stdexcept>

#include "parallel/pipeline/pipeline_runner.h"

namespace shardtrain {

MixedPrecision mixed_precision_of(const TrainConfig& config) {
  auto dtype = [](const std::string& name) { return name == "bf16" ? at::kBFloat16 : at::kFloat; };
  return MixedPrecision()
      .param_dtype(dtype(config.param_dtype))
      .reduce_dtype(dtype(config.reduce_dtype))
      .buffer_dtype(dtype(config.buffer_dtype));
}

void apply_activation_checkpointing(Transformer& model, const TrainConfig& config) {
  model->set_activation_checkpointing(config.activation_checkpointing);
}

Parallelized::Parallelized() = default;
Parallelized::Parallelized(Parallelized&&) noexcept = default;
Parallelized::~Parallelized() = default;

std::vector<std::pair<int64_t, int64_t>> pipeline_blocks(const TrainConfig& config) {
  return pipeline_stage_blocks(config.model.n_layers,
                               static_cast<int>(config.pp * config.pp_virtual_stages),
                               config.pp_split);
}

PipelineSchedule pipeline_schedule(const TrainConfig& config) {
  return make_pipeline_schedule(
      pipeline_schedule_from_string(config.pp_schedule), static_cast<int>(config.pp),
      static_cast<int>(config.pp_virtual_stages), static_cast<int>(config.grad_accum));
}

void check_parallel_settings(const TrainConfig& config) {
  if (config.pp == 1) return;
  pipeline_blocks(config);
  pipeline_schedule(config);
}

ModelParts pipeline_parts(const TrainConfig& config, int pp_rank) {
  const auto blocks = pipeline_blocks(config);
  const int stages = static_cast<int>(blocks.size());
  ModelParts parts;
  for (int s = pp_rank; s < stages; s += static_cast<int>(config.pp)) {
    parts.blocks.push_back(blocks[static_cast<size_t>(s)]);
  }
  parts.embedding = pp_rank == 0;
  parts.head = (stages - 1) % config.pp == pp_rank;
  return parts;
}

std::unique_ptr<detail::PipelineRunner> apply_pp(Transformer& model, const TrainConfig& config,
                                                 const DeviceMesh& mesh) {
  if (mesh.size(MeshAxis::kPp) == 1) return nullptr;
  return std::make_unique<detail::PipelineRunner>(
      model, mesh.group_ptr(MeshAxis::kPp), pipeline_schedule(config), pipeline_blocks(config),
      /*split_backward=*/!config.activation_checkpointing);
}

MeshShape train_mesh_shape(const TrainConfig& config, int world_size, int ranks_per_node) {
  const int tp = static_cast<int>(config.tp);
  if (world_size % tp != 0) {
    throw std::invalid_argument("world size " + std::to_string(world_size) +
                                " is not divisible by parallel.tp=" + std::to_string(tp));
  }
  const int pp = static_cast<int>(config.pp);
  if (world_size % (pp * tp) != 0) {
    throw std::invalid_argument("world size " + std::to_string(world_size) +
                                " is not divisible by parallel.pp=" + std::to_string(pp) +
                                (tp > 1 ? " x parallel.tp=" + std::to_string(tp) : std::string()));
  }
  int replicate = 1;
  if (config.strategy == "fsdp" &&
      sharding_strategy_from_string(config.fsdp_sharding) == ShardingStrategy::kHybridShard) {
    replicate = static_cast<int>(config.fsdp_replicate);
    if (replicate == 0) {
      // One replica per node, sharding inside it, as PyTorch's hybrid_shard does. Pipeline
      // stages are the mesh's outermost axis: a stage's ranks span nodes / pp nodes.
      const int nodes =
          ranks_per_node > 0 && world_size % ranks_per_node == 0 ? world_size / ranks_per_node : 0;
      if (nodes % pp != 0 || nodes / pp < 2) {
        throw std::invalid_argument(
            "parallel.fsdp.sharding = \"hybrid_shard\" needs parallel.fsdp.replicate (the "
            "dp_replicate size) when the ranks " +
            std::string(pp > 1 ? "of a pipeline stage " : "") + "are not on several nodes");
      }
      replicate = nodes / pp;
    }
  }
  return resolve_mesh(MeshShape().pp(pp).dp_replicate(replicate).tp(tp), world_size);
}

Parallelized parallelize(Transformer& model, const TrainConfig& config,
                         const std::shared_ptr<ProcessGroup>& world, const DeviceMesh* mesh) {
  Parallelized out;
  const bool sharded = config.strategy == "fsdp" || config.strategy == "zero";
  const bool meshed = config.tp > 1 || config.pp > 1 || sharded;
  if (!(world && mesh) && meshed) {
    throw std::invalid_argument("parallel.tp > 1, parallel.pp > 1 and parallel.strategy \"" +
                                config.strategy + "\" need a process group");
  }
  if (config.tp > 1) apply_tp(model, config, *mesh);
  apply_activation_checkpointing(model, config);
  if (config.strategy == "fsdp") {
    apply_fsdp(model, config, *mesh, out);
  } else if (config.strategy == "zero") {
    apply_zero(model, config, *mesh, out);
  } else if (config.strategy == "ddp" && world) {
    // Plain DDP keeps the world as its group; under tp or pp it runs on the mesh's dp axis.
    const auto dp = meshed ? mesh->dp_ptr() : world;
    if (dp->size() > 1) out.ddp = apply_ddp(model, config, dp);
  }
  // What no sharded step took over is held whole (each rank's slices of what tensor
  // parallelism split): "none", and DDP on one data-parallel rank.
  if (!out.sharded) model->materialize();
  if (mesh) out.pipeline = apply_pp(model, config, *mesh);
  return out;
}

}  // namespace shardtrain
