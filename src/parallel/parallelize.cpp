#include "parallel/parallelize.h"

#include <numeric>
#include <stdexcept>

#include "parallel/expert/expert_parallel.h"
#include "parallel/pipeline/pipelined_model.h"
#include "shardtrain/tensor_parallel.h"

namespace shardtrain {

MixedPrecision mixed_precision_of(const TrainConfig& config) {
  auto dtype = [](const std::string& name) { return name == "bf16" ? at::kBFloat16 : at::kFloat; };
  return MixedPrecision()
      .param_dtype(dtype(config.precision.param_dtype))
      .reduce_dtype(dtype(config.precision.reduce_dtype))
      .buffer_dtype(dtype(config.precision.buffer_dtype));
}

void apply_activation_checkpointing(Transformer& model, bool enabled) {
  model->set_activation_checkpointing(enabled);
}

std::string attention_kernel_name(const TrainConfig& config) {
  if (config.train.attention != "auto") return config.train.attention;
  // On CUDA, LibTorch's fused kernels (flash, memory-efficient) hold no [seq x seq] scores.
  return config.model.dropout > 0.0 || config.run.device == "cuda" ? "fused" : "blockwise";
}

AttentionKernel attention_kernel(const TrainConfig& config) {
  const std::string name = attention_kernel_name(config);
  return name == "fused"       ? AttentionKernel::kFused
         : name == "reference" ? AttentionKernel::kReference
                               : AttentionKernel::kBlockwise;
}

std::vector<std::pair<int64_t, int64_t>> pipeline_blocks(const TrainConfig& config) {
  return pipeline_stage_blocks(
      config.model.n_layers,
      static_cast<int>(config.parallel.pp * config.parallel.pp_virtual_stages),
      config.parallel.pp_split);
}

PipelineSchedule pipeline_schedule(const TrainConfig& config) {
  return make_pipeline_schedule(config.parallel.pp_schedule, static_cast<int>(config.parallel.pp),
                                static_cast<int>(config.parallel.pp_virtual_stages),
                                static_cast<int>(config.train.grad_accum));
}

void check_parallel_settings(const TrainConfig& config) {
  if (config.parallel.pp == 1) return;
  pipeline_blocks(config);
  pipeline_schedule(config);
}

ModelParts pipeline_parts(const TrainConfig& config, int pp_rank) {
  const auto blocks = pipeline_blocks(config);
  const int stages = static_cast<int>(blocks.size());
  ModelParts parts;
  for (int s = pp_rank; s < stages; s += static_cast<int>(config.parallel.pp)) {
    parts.blocks.push_back(blocks[static_cast<size_t>(s)]);
  }
  parts.embedding = pp_rank == 0;
  parts.head = (stages - 1) % config.parallel.pp == pp_rank;
  return parts;
}

std::unique_ptr<ParallelModel> apply_pp(std::unique_ptr<ParallelModel> stage, Transformer& model,
                                        PipelineSchedule schedule,
                                        std::vector<std::pair<int64_t, int64_t>> blocks,
                                        bool split_backward,
                                        const std::shared_ptr<ProcessGroup>& world,
                                        const DeviceMesh& mesh) {
  if (mesh.size(MeshAxis::kPp) == 1) return stage;
  std::string split;
  for (const auto& [begin, end] : blocks) {
    split += (split.empty() ? "" : ", ") + std::to_string(end - begin);
  }
  const std::string description =
      stage->description() + "pipeline parallel over " + std::to_string(schedule.ranks) +
      " ranks (" + to_string(schedule.kind) + ", " + std::to_string(schedule.stages()) +
      " stage(s) of [" + split + "] blocks), " + std::to_string(schedule.micro_batches) +
      " micro-batches per step\n";
  auto runner = std::make_unique<detail::PipelineRunner>(
      model, mesh.group_ptr(MeshAxis::kPp), std::move(schedule), std::move(blocks), split_backward);
  return std::make_unique<PipelinedModel>(std::move(stage), std::move(runner),
                                          mesh.group(MeshAxis::kPp), world, model, description);
}

bool runs_on_a_group(const TrainConfig& config) {
  return config.parallel.strategy == ParallelStrategy::kFsdp ||
         config.parallel.strategy == ParallelStrategy::kZero;
}

void check_data_parallel_ranks(const TrainConfig& config, const MeshShape& shape, int world_size) {
  if (shape.degree(MeshAxis::kDpReplicate) * shape.degree(MeshAxis::kDpShard) > 1 &&
      config.parallel.strategy == ParallelStrategy::kNone) {
    throw std::invalid_argument(
        "parallel.strategy = \"none\" trains on one process" +
        std::string(config.parallel.tp > 1 ? " (or one tensor-parallel group)" : "") +
        ", but the world has " + std::to_string(world_size) +
        " ranks; set parallel.strategy = \"ddp\" or \"fsdp\"");
  }
}

void check_tp_sizes(const TrainConfig& config, const std::string& vocabulary) {
  if (config.parallel.tp == 1) return;
  if (config.model.vocab_size % config.parallel.tp != 0) {
    const int64_t tp = config.parallel.tp, vocab = config.model.vocab_size;
    const int64_t multiple = std::lcm<int64_t>(tp, 64);
    throw std::invalid_argument(
        "tensor parallelism splits the vocabulary: " + vocabulary + " (" + std::to_string(vocab) +
        ") is not divisible by parallel.tp=" + std::to_string(tp) +
        "; set model.vocab_size to a multiple of " + std::to_string(tp) + " that holds it, e.g. " +
        std::to_string((vocab + multiple - 1) / multiple * multiple) +
        " (a multiple of 64 too, so that its checkpoints resume at any tp dividing 64)");
  }
  // Heads, key/value heads and the FFN width too.
  transformer_tp_plan(config.model, static_cast<int>(config.parallel.tp));
}

bool keeps_state_in_files(const TrainConfig& config) {
  return config.parallel.strategy == ParallelStrategy::kZero &&
         (config.parallel.zero.offload_param == OffloadDevice::kNvme ||
          config.parallel.zero.offload_optimizer == OffloadDevice::kNvme);
}

void limit_to_own_parts(ModelInit& init, const TrainConfig& config, int pp_rank, int ep_rank) {
  if (config.parallel.pp == 1 && config.parallel.ep == 1) return;
  ModelParts parts;
  if (config.parallel.pp > 1) {
    parts = pipeline_parts(config, pp_rank);
  } else {
    parts.blocks = {{0, config.model.n_layers}};
  }
  limit_to_own_experts(parts, config.model, ep_rank, static_cast<int>(config.parallel.ep));
  init.parts(std::move(parts));
}

MeshShape train_mesh_shape(const TrainConfig& config, int world_size, int ranks_per_node) {
  const int tp = static_cast<int>(config.parallel.tp);
  if (world_size % tp != 0) {
    throw std::invalid_argument("world size " + std::to_string(world_size) +
                                " is not divisible by parallel.tp=" + std::to_string(tp));
  }
  const int pp = static_cast<int>(config.parallel.pp);
  if (world_size % (pp * tp) != 0) {
    throw std::invalid_argument("world size " + std::to_string(world_size) +
                                " is not divisible by parallel.pp=" + std::to_string(pp) +
                                (tp > 1 ? " x parallel.tp=" + std::to_string(tp) : std::string()));
  }
  int replicate = 1;
  if (config.parallel.strategy == ParallelStrategy::kFsdp &&
      config.parallel.fsdp.sharding == ShardingStrategy::kHybridShard) {
    replicate = static_cast<int>(config.parallel.fsdp.replicate);
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
  const int cp = static_cast<int>(config.parallel.cp);
  if (world_size % (pp * cp * tp) != 0) {
    throw std::invalid_argument("world size " + std::to_string(world_size) +
                                " is not divisible by parallel.cp=" + std::to_string(cp) +
                                (pp * tp > 1 ? " x the other model-parallel degrees" : ""));
  }
  MeshShape shape =
      resolve_mesh(MeshShape().pp(pp).dp_replicate(replicate).cp(cp).tp(tp), world_size);
  const int ep = static_cast<int>(config.parallel.ep);
  const int shard = shape.degree(MeshAxis::kDpShard);
  if (shard % ep != 0) {
    std::string others = "pp=" + std::to_string(pp) + " x tp=" + std::to_string(tp);
    if (replicate > 1) others += " x dp_replicate=" + std::to_string(replicate);
    if (cp > 1) others += " x cp=" + std::to_string(cp);
    throw std::invalid_argument(
        "parallel.ep=" + std::to_string(ep) + " does not divide the " + std::to_string(shard) +
        " data-parallel rank(s) of dp_shard (world size " + std::to_string(world_size) + " / " +
        others + "): the experts are split over those ranks");
  }
  return shape.ep(ep);
}

std::unique_ptr<ParallelModel> parallelize(Transformer& model, const TrainConfig& config,
                                           const std::shared_ptr<ProcessGroup>& world,
                                           const DeviceMesh* mesh) {
  const bool meshed = config.parallel.tp > 1 || config.parallel.pp > 1 || config.parallel.ep > 1 ||
                      runs_on_a_group(config);
  if (!(world && mesh) && meshed) {
    throw std::invalid_argument("parallel.tp > 1, parallel.pp > 1 and parallel.strategy \"" +
                                to_string(config.parallel.strategy) + "\" need a process group");
  }
  if (config.parallel.tp > 1) {
    apply_tp(model, TensorParallelOptions().sequence_parallel(config.parallel.sequence_parallel),
             *mesh);
  }
  if (config.parallel.cp > 1) apply_cp(model, *mesh);
  if (config.parallel.ep > 1) apply_ep(model, mesh->data_parallel_mesh());
  if (config.run.device == "cuda") {
    // Initialization fills the parameters on the CPU (model/init.cpp); the whole model then
    // moves to the current CUDA device, which the trainer chose (one process, no sharding).
    model->materialize();
    model->to(at::Device(at::kCUDA));
  }
  apply_activation_checkpointing(model, config.train.activation_checkpointing);
  model->set_attention(attention_kernel(config));
  // One data-parallel step, each strategy's from its own folder, over dp_shard x cp: the ranks
  // of a cp group hold the same parameters and sum their gradients.
  const DeviceMesh* data_mesh = mesh ? &mesh->data_parallel_mesh() : nullptr;
  std::unique_ptr<ParallelModel> out =
      config.parallel.strategy == ParallelStrategy::kFsdp
          ? apply_fsdp(model, fsdp_options(config), world, *data_mesh)
      : config.parallel.strategy == ParallelStrategy::kZero
          ? apply_zero(model, zero_options(config), world, *data_mesh)
          : apply_ddp(model, ddp_options(config), world, data_mesh);
  if (config.parallel.pp > 1) {
    out = apply_pp(std::move(out), model, pipeline_schedule(config), pipeline_blocks(config),
                   /*split_backward=*/!config.train.activation_checkpointing, world, *mesh);
  }
  if (config.parallel.ep > 1) {
    out->append_description(
        "expert parallel over groups of " + std::to_string(config.parallel.ep) + " ranks (" +
        std::to_string(config.model.n_experts / config.parallel.ep) + " of " +
        std::to_string(config.model.n_experts) + " experts per rank, tokens by all-to-all)\n");
  }
  if (config.parallel.cp > 1) {
    out->append_description("context parallel over groups of " +
                            std::to_string(config.parallel.cp) +
                            " ranks (ring attention, load-balanced causal chunks)\n");
  }
  if (config.parallel.tp > 1) {
    out->append_description(
        "tensor parallel over groups of " + std::to_string(config.parallel.tp) + " ranks" +
        (config.parallel.sequence_parallel ? " with sequence parallelism" : "") + ", " +
        std::to_string(mesh->dp().size()) + " data-parallel rank(s)\n");
  }
  return out;
}

}  // namespace shardtrain
