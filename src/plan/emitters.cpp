// The configs that run a candidate: shardtrain TOML, DeepSpeed ds_config.json, accelerate YAML.
#include <nlohmann/json.hpp>
#include <sstream>

#include "shardtrain/plan.h"

namespace shardtrain {
namespace {

int64_t global_batch(const Plan& plan, const Candidate& c) {
  return plan.workload.micro_batch_ * c.grad_accum * c.dp;
}

bool bf16(const Plan& plan) { return plan.workload.precision_ != "fp32"; }

std::string header(const Plan& plan, const Candidate& c, const char* comment) {
  std::ostringstream out;
  out << comment << " " << c.label() << " for " << plan.model.name << " on "
      << plan.cluster.world_size() << " x " << plan.hardware.name << " (" << plan.cluster.nodes_
      << " node" << (plan.cluster.nodes_ > 1 ? "s" : "") << "), from shardtrain plan\n";
  return out.str();
}

}  // namespace

std::string shardtrain_toml(const Plan& plan, const Candidate& c) {
  const PlanModel& m = plan.model;
  const WorkloadOptions& w = plan.workload;
  std::ostringstream out;
  out << header(plan, c, "#");
  out << "\n[model]\n";
  // Tensor parallelism splits the vocabulary evenly: pad it as Megatron-LM does, to a multiple
  // of 128 x tp (the extra ids are never seen in the data), which keeps its checkpoints
  // loadable at any smaller power-of-two tp.
  const int64_t tp = c.strategy == PlanStrategy::kTpPp ? c.tp : 1;
  const int64_t multiple = 128 * tp;
  const int64_t vocab = tp > 1 && m.vocab_size % tp != 0
                            ? (m.vocab_size + multiple - 1) / multiple * multiple
                            : m.vocab_size;
  const char* padded = vocab != m.vocab_size ? "  # padded to a multiple of 128 x tp" : "";
  if (!m.preset.empty() || !m.hf_config.empty()) {
    if (!m.preset.empty()) {
      out << "preset = \"" << m.preset << "\"\n";
    } else {
      out << "hf_config = \"" << m.hf_config << "\"\n";
    }
    if (*padded) out << "vocab_size = " << vocab << padded << "\n";
  } else {
    // A bare shape: the family comes from a preset, every size from the keys after it.
    out << "preset = \"" << (m.gated_mlp ? "tiny-llama" : "tiny") << "\"\n"
        << "vocab_size = " << vocab << padded << "\ncontext_length = " << w.seq_len_
        << "\nd_model = " << m.d_model << "\nn_layers = " << m.n_layers
        << "\nn_heads = " << m.n_heads << "\nn_kv_heads = " << m.n_kv_heads
        << "\nffn_hidden = " << m.ffn_hidden << "\n";
  }
  out << "\n[data]\nseq_len = " << w.seq_len_ << "\n";
  const bool pipelined = c.strategy == PlanStrategy::kTpPp && c.pp > 1;
  out << "\n[train]\nmicro_batch = " << w.micro_batch_ << "\ngrad_accum = " << c.grad_accum
      << "\nactivation_checkpointing = " << (w.checkpointing_ || w.selective_ ? "true" : "false")
      << (w.selective_ ? "  # full: shardtrain has no per-operator selective checkpointing" : "")
      << "\n";
  out << "\n[parallel]\n";
  switch (c.strategy) {
    case PlanStrategy::kDdp:
      out << "strategy = \"ddp\"\n";
      break;
    case PlanStrategy::kZero2:
      out << (c.lora ? "strategy = \"fsdp\"\n" : "strategy = \"zero\"\n");
      break;
    case PlanStrategy::kZero1:
      out << "strategy = \"zero\"\n";
      break;
    case PlanStrategy::kTpPp:  // ZeRO-1 across the data-parallel ranks, as the estimate
      out << "strategy = \"zero\"\n";
      break;
    case PlanStrategy::kFullShard:
    case PlanStrategy::kHybridShard:
      out << "strategy = \"fsdp\"\n";
      break;
  }
  if (c.cp > 1) out << "cp = " << c.cp << "\n";
  if (c.ep > 1) out << "ep = " << c.ep << "\n";
  if (c.strategy == PlanStrategy::kTpPp || c.tp > 1) {
    // The planner's tensor-parallel layouts run with sequence parallelism (its memory model
    // assumes it). 1F1B needs a micro-batch per stage; with fewer, GPipe runs. A split that is
    // not even puts the larger stages first, as the estimate counts the largest.
    out << "tp = " << c.tp << "\nsequence_parallel = " << (c.tp > 1 ? "true" : "false") << "\n";
    if (pipelined) {
      const bool interleaved = w.virtual_stages_ > 1 && c.grad_accum % c.pp == 0;
      out << "pp = " << c.pp << "\npp_schedule = \""
          << (interleaved            ? "interleaved_1f1b"
              : c.grad_accum >= c.pp ? "1f1b"
                                     : "gpipe")
          << "\"\n";
      if (interleaved) out << "pp_virtual_stages = " << w.virtual_stages_ << "\n";
    }
  }
  if (c.strategy == PlanStrategy::kFullShard || c.strategy == PlanStrategy::kHybridShard) {
    const bool hybrid = c.strategy == PlanStrategy::kHybridShard;
    out << "\n[parallel.fsdp]\nsharding = \"" << (hybrid ? "hybrid_shard" : "full_shard") << "\"\n";
    if (hybrid) out << "replicate = " << c.dp / c.shard << "\n";
    out << "cpu_offload = " << (c.offload ? "true" : "false") << "\nwrap = \"block\"\n";
  } else if (c.lora && c.strategy == PlanStrategy::kZero2) {
    out << "\n[parallel.fsdp]\nsharding = \"shard_grad_op\"\nwrap = \"block\"\n";
  } else if (c.strategy != PlanStrategy::kDdp) {
    const int stage = c.strategy == PlanStrategy::kZero2 ? 2 : 1;
    out << "\n[parallel.zero]\nstage = " << stage << "\noffload_optimizer = \""
        << (c.offload ? "cpu" : "none") << "\"\noffload_param = \"none\"\n";
  }
  // The bf16 parameter/reduction policy is FSDP's and ZeRO's; DDP computes under autocast, as
  // does a pipeline, whose stages accumulate gradients over the micro-batches in the compute
  // dtype before reducing them.
  const bool mixed = w.precision_ == "bf16" && c.strategy != PlanStrategy::kDdp && !pipelined;
  const bool bf16_grads = mixed && !w.fp32_grads_;
  out << "\n[precision]\nparam_dtype = \"" << (mixed ? "bf16" : "fp32") << "\"\nreduce_dtype = \""
      << (bf16_grads ? "bf16" : "fp32") << "\"\nautocast = \"" << (bf16(plan) ? "bf16" : "none")
      << "\"\n";
  if (c.lora) {
    out << "\n[lora]\nrank = " << w.lora_rank_ << "\nalpha = " << 2 * w.lora_rank_
        << "\ntarget_modules = \"all-linear\"\nbase_dtype = \"" << w.lora_base_ << "\"\n";
  }
  return out.str();
}

std::string deepspeed_json(const Plan& plan, const Candidate& c) {
  nlohmann::ordered_json zero;
  int stage = 0;
  switch (c.strategy) {
    case PlanStrategy::kDdp:
      stage = 0;
      break;
    case PlanStrategy::kZero1:
    case PlanStrategy::kTpPp:  // the data-parallel part; TP and PP are set in the model code
      stage = 1;
      break;
    case PlanStrategy::kZero2:
      stage = 2;
      break;
    case PlanStrategy::kFullShard:
    case PlanStrategy::kHybridShard:
      stage = 3;
      break;
  }
  zero["stage"] = stage;
  if (stage > 0) {
    zero["overlap_comm"] = true;
    zero["contiguous_gradients"] = true;
    zero["reduce_bucket_size"] = 50000000;
  }
  if (stage == 1 || stage == 2) zero["allgather_bucket_size"] = 50000000;
  if (c.offload) {
    zero["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
    if (stage == 3) zero["offload_param"] = {{"device", "cpu"}, {"pin_memory", true}};
  }
  // MiCS: parameters sharded inside groups of this size and replicated across them.
  if (c.strategy == PlanStrategy::kHybridShard) zero["mics_shard_size"] = c.shard;
  nlohmann::ordered_json ds;
  ds["train_batch_size"] = global_batch(plan, c);
  ds["train_micro_batch_size_per_gpu"] = plan.workload.micro_batch_;
  ds["gradient_accumulation_steps"] = c.grad_accum;
  ds["gradient_clipping"] = 1.0;
  ds["bf16"] = {{"enabled", bf16(plan)}};
  if (plan.workload.fp32_grads_) ds["data_types"] = {{"grad_accum_dtype", "fp32"}};
  ds["zero_optimization"] = zero;
  return ds.dump(2) + "\n";
}

std::string accelerate_yaml(const Plan& plan, const Candidate& c) {
  const WorkloadOptions& w = plan.workload;
  std::ostringstream out;
  out << header(plan, c, "#");
  out << "compute_environment: LOCAL_MACHINE\n";
  if (c.cp > 1) {
    out << "# context parallel " << c.cp
        << " has no key in this file: give --set parallel.cp=" << c.cp << " with it\n";
  }
  if (c.ep > 1) {
    out << "# expert parallel " << c.ep
        << " has no key in this file: give --set parallel.ep=" << c.ep << " with it\n";
  }
  const char* ckpt = w.checkpointing_ || w.selective_ ? "true" : "false";
  switch (c.strategy) {
    case PlanStrategy::kDdp:
      out << "distributed_type: MULTI_GPU\n";
      break;
    case PlanStrategy::kTpPp:
      // Only the keys of features that run are written: the data-parallel part of this layout.
      out << "# tensor parallel " << c.tp << " x pipeline parallel " << c.pp
          << " have no keys in this file: it trains ZeRO-1 over every rank\n";
      [[fallthrough]];
    case PlanStrategy::kZero1:
    case PlanStrategy::kZero2:
      out << "distributed_type: DEEPSPEED\ndeepspeed_config:\n"
          << "  gradient_accumulation_steps: " << c.grad_accum << "\n"
          << "  gradient_clipping: 1.0\n"
          << "  offload_optimizer_device: " << (c.offload ? "cpu" : "none") << "\n"
          << "  offload_param_device: none\n"
          << "  zero3_init_flag: false\n"
          << "  zero_stage: " << (c.strategy == PlanStrategy::kZero2 ? 2 : 1) << "\n";
      break;
    case PlanStrategy::kFullShard:
    case PlanStrategy::kHybridShard:
      out << "distributed_type: FSDP\nfsdp_config:\n"
          << "  fsdp_activation_checkpointing: " << ckpt << "\n"
          << "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
          << "  fsdp_backward_prefetch: BACKWARD_PRE\n"
          << "  fsdp_offload_params: " << (c.offload ? "true" : "false") << "\n"
          << "  fsdp_sharding_strategy: "
          << (c.strategy == PlanStrategy::kHybridShard ? "HYBRID_SHARD" : "FULL_SHARD") << "\n"
          << "  fsdp_state_dict_type: SHARDED_STATE_DICT\n"
          << "  fsdp_transformer_layer_cls_to_wrap: "
          << (plan.model.gated_mlp ? "LlamaDecoderLayer" : "GPT2Block") << "\n"
          << "  fsdp_use_orig_params: true\n";
      break;
  }
  out << "mixed_precision: " << (bf16(plan) ? "bf16" : "'no'") << "\n"
      << "machine_rank: 0\nnum_machines: " << plan.cluster.nodes_
      << "\nnum_processes: " << plan.cluster.world_size()
      << "\nrdzv_backend: static\nsame_network: true\n"
      << "use_cpu: " << (plan.hardware.name == "cpu" ? "true" : "false") << "\n";
  return out.str();
}

}  // namespace shardtrain
