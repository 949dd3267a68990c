// The plan: every candidate evaluated, the fastest that fits recommended, and the reasons.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "plan/text.h"
#include "shardtrain/plan.h"

namespace shardtrain {
namespace {

void check_inputs(const ClusterOptions& c, const WorkloadOptions& w) {
  auto require = [](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument(what);
  };
  // The bounds keep every product of sizes (devices, tokens per step) inside 64-bit integers,
  // so no table shows a wrapped value.
  require(c.gpus_per_node_ >= 1 && c.gpus_per_node_ <= 1024,
          "devices per node must be between 1 and 1024, got " + std::to_string(c.gpus_per_node_));
  require(c.nodes_ >= 1 && c.nodes_ <= 65536,
          "nodes must be between 1 and 65536, got " + std::to_string(c.nodes_));
  require(c.intra_.empty() || c.intra_ == "nvlink" || c.intra_ == "pcie3" || c.intra_ == "pcie4" ||
              c.intra_ == "pcie5" || c.intra_ == "loopback",
          "intra-node link '" + c.intra_ + "' is not one of nvlink, pcie3, pcie4, pcie5, loopback");
  require(c.inter_ == "ib" || c.inter_ == "ethernet",
          "inter-node link '" + c.inter_ + "' is not one of ib, ethernet");
  require(std::isfinite(c.inter_bw_) && c.inter_bw_ >= 0,
          "inter-node bandwidth must be a positive number of bytes/s (0: the network's usual "
          "one), got " +
              std::to_string(c.inter_bw_));
  require(std::isfinite(c.host_memory_) && c.host_memory_ >= 0,
          "host memory must be a positive number of bytes (0: the device's reference server), "
          "got " +
              std::to_string(c.host_memory_));
  require(w.seq_len_ >= 1 && w.seq_len_ <= (int64_t{1} << 30),
          "seq_len must be between 1 and 2^30, got " + std::to_string(w.seq_len_));
  require(w.micro_batch_ >= 1 && w.micro_batch_ <= (int64_t{1} << 20),
          "micro_batch must be between 1 and 2^20, got " + std::to_string(w.micro_batch_));
  require(w.global_batch_ >= 0 && w.global_batch_ <= (int64_t{1} << 30),
          "global_batch must be between 0 (micro_batch x devices) and 2^30, got " +
              std::to_string(w.global_batch_));
  require(w.safety_margin_ >= 0 && w.safety_margin_ < 1,
          "safety margin must be in [0, 1), got " + std::to_string(w.safety_margin_));
  require(w.lora_rank_ >= 0,
          "LoRA rank must be >= 0 (0: full training), got " + std::to_string(w.lora_rank_));
  require(w.lora_base_ == "fp32" || w.lora_base_ == "bf16" || w.lora_base_ == "nf4",
          "LoRA base dtype must be fp32, bf16 or nf4, got '" + w.lora_base_ + "'");
  require(w.efficiency_ >= 0 && w.efficiency_ <= 1,
          "efficiency must be in (0, 1] (0: the hardware's default), got " +
              std::to_string(w.efficiency_));
  PrecisionBytes::of(w.precision_, w.optimizer_, w.fp32_grads_);  // throws for unknown names
  require(
      w.virtual_stages_ >= 1 && w.virtual_stages_ <= 64,
      "virtual pipeline stages must be between 1 and 64, got " + std::to_string(w.virtual_stages_));
  require(!(w.checkpointing_ && w.selective_),
          "activation checkpointing is full or selective, not both");
  require(!w.selective_ || w.fused_attention_,
          "selective checkpointing keeps the output of a fused attention kernel: it is "
          "estimated without --unfused-attention");
}

std::vector<Candidate> shapes(const PlanModel& model, const ClusterOptions& cluster,
                              const WorkloadOptions& workload) {
  std::vector<Candidate> out;
  auto add = [&](PlanStrategy s, bool offload, int tp = 1, int pp = 1) {
    Candidate c;
    c.strategy = s;
    c.offload = offload;
    c.tp = tp;
    c.pp = pp;
    out.push_back(c);
  };
  add(PlanStrategy::kDdp, false);
  if (workload.lora_rank_ > 0) {
    // The decision tree's LoRA branch: the adapters are small, so DDP when the frozen base fits
    // on every device, else FSDP shard_grad_op, else full_shard; nothing to offload.
    for (PlanStrategy s :
         {PlanStrategy::kZero2, PlanStrategy::kFullShard, PlanStrategy::kHybridShard}) {
      if (s != PlanStrategy::kHybridShard || cluster.nodes_ >= 2) add(s, false);
    }
    return out;
  }
  for (PlanStrategy s : {PlanStrategy::kZero1, PlanStrategy::kZero2, PlanStrategy::kFullShard,
                         PlanStrategy::kHybridShard}) {
    if (s == PlanStrategy::kHybridShard && cluster.nodes_ < 2) continue;
    add(s, false);
    add(s, true);
  }
  const int world = cluster.world_size();
  // Long sequences: context parallelism under FSDP, as torchtitan trains 32k-262k tokens.
  if (workload.seq_len_ >= 8192) {
    for (int cp = 2; cp <= std::min(8, world); cp *= 2) {
      Candidate c;
      c.strategy = PlanStrategy::kFullShard;
      c.cp = cp;
      out.push_back(c);
    }
  }
  // Mixture-of-experts models: the experts split over the data-parallel devices (torchtitan's
  // and DeepSpeed-MoE's expert parallelism), within a node first.
  if (model.n_experts > 0) {
    for (int ep = 2; ep <= std::min<int64_t>(model.n_experts, world); ep *= 2) {
      for (PlanStrategy s : {PlanStrategy::kZero1, PlanStrategy::kFullShard}) {
        Candidate c;
        c.strategy = s;
        c.ep = ep;
        out.push_back(c);
      }
    }
  }
  for (int tp = 1; tp <= std::min(8, cluster.gpus_per_node_); tp *= 2) {
    for (int pp = 1; tp * pp <= world && pp <= std::min<int64_t>(64, model.n_layers); pp *= 2) {
      if (tp * pp > 1) add(PlanStrategy::kTpPp, false, tp, pp);
    }
  }
  // 2D: FSDP across nodes, tensor parallelism inside one (torchtitan's FSDP x TP); not for a
  // mixture of experts, which the trainer does not split by tp.
  if (model.n_experts == 0) {
    for (int tp = 2; tp <= std::min(8, cluster.gpus_per_node_) && tp < world; tp *= 2) {
      add(PlanStrategy::kFullShard, false, tp);
    }
  }
  return out;
}

std::string percent_slower(const Candidate& slow, const Candidate& fast) {
  return detail::format("%.0f%%", 100.0 * (slow.time.total / fast.time.total - 1.0));
}

std::string explain(const Plan& plan, double usable) {
  const auto& cs = plan.candidates;
  const Candidate* rec = plan.recommendation();
  std::string out;
  if (!rec) {
    const Candidate* smallest = nullptr;
    for (const auto& c : cs) {
      if (c.valid && (!smallest || c.memory.total() < smallest->memory.total())) smallest = &c;
    }
    out = "Does not fit: no candidate fits in " + detail::gb(usable) + " per device";
    if (smallest) {
      out += "; the smallest, " + smallest->label() + ", needs " +
             detail::gb(smallest->memory.total()) + " per device (" + smallest->note + ")";
    }
    // Only what is not already on.
    const auto& w = plan.workload;
    std::string help = "More devices";
    if (!w.checkpointing_)
      help += w.selective_ ? ", full activation checkpointing" : ", activation checkpointing";
    if (w.micro_batch_ > 1) help += ", a smaller micro-batch";
    return out + ". " + help + " would help.";
  }
  out = "Recommended: " + rec->label() + detail::format(": %.0f tokens/s", rec->tokens_per_s) +
        ", " + detail::gb(rec->memory.total()) + " of " + detail::gb(usable) +
        " usable per device" +
        detail::format(", scaling efficiency %.0f%%.", 100 * rec->scaling_efficiency);
  const Candidate& ddp = cs.front();
  if (rec->lora) {
    const auto& w = plan.workload;
    const double adapters = static_cast<double>(plan.model.n_layers) *
                            static_cast<double>(plan.model.block_lora_parameters(w.lora_rank_));
    out += detail::format(
        " LoRA rank %lld: %.2fM adapter parameters train (%.2f%% of the model), the base is "
        "frozen in %s, so the optimizer state and the gradient traffic are the adapters' alone;",
        static_cast<long long>(w.lora_rank_), adapters / 1e6,
        100.0 * adapters / static_cast<double>(plan.model.num_parameters), w.lora_base_.c_str());
    out += rec->strategy == PlanStrategy::kDdp
               ? " the frozen base fits on every device, so DDP (replicate it, all-reduce the "
                 "adapters' gradients) is the simplest and fastest."
               : " the frozen base (" + detail::gb(ddp.memory.params) +
                     " per device under DDP) does not fit replicated, so FSDP shards it.";
    return out;
  }
  if (rec->strategy == PlanStrategy::kDdp) {
    out += " The replicated model states (" + detail::gb(ddp.memory.model_states()) +
           ") fit on every device, so sharding them would only add communication.";
  } else if (!ddp.valid) {
    out += " Not DDP: " + ddp.note + ".";
  } else if (!ddp.fits) {
    out += " Not DDP: every device would hold all parameters, gradients and optimizer states, " +
           detail::gb(ddp.memory.model_states()) + " of model states and " +
           detail::gb(ddp.memory.total()) + " in all, over the usable " + detail::gb(usable) + ".";
  } else {
    out += " Not DDP: it fits, but is " + percent_slower(ddp, *rec) + " slower: " +
           detail::format(
               "%.3f s per step (compute and optimizer %.3f s, unhidden gradient "
               "all-reduce %.3f s) against %.3f s (%.3f s and %.3f s).",
               ddp.time.total, ddp.time.compute, ddp.time.exposed_comm, rec->time.total,
               rec->time.compute, rec->time.exposed_comm + rec->time.bubble + rec->time.offload);
  }
  if (rec->offload) {
    const Candidate* best_on_device = nullptr;
    for (const auto& c : cs) {
      if (c.valid && !c.offload &&
          (!best_on_device || c.memory.total() < best_on_device->memory.total())) {
        best_on_device = &c;
      }
    }
    out += " Offload because nothing fits on the devices alone";
    if (best_on_device) {
      out += " (the smallest, " + best_on_device->label() + ", needs " +
             detail::gb(best_on_device->memory.total()) + ")";
    }
    out += "; it keeps " + detail::gb(rec->host_bytes_per_node) +
           " per node in host memory and costs " + detail::format("%.2f s", rec->time.offload) +
           " per step in PCIe copies and the host optimizer step.";
  } else {
    const Candidate* best_offload = nullptr;
    for (const auto& c : cs) {
      if (c.valid && c.offload && c.fits &&
          (!best_offload || c.time.total < best_offload->time.total)) {
        best_offload = &c;
      }
    }
    if (best_offload) {
      out +=
          " Not offload: the states fit on the devices, and moving them over PCIe to step on "
          "the host makes the fastest offload candidate (" +
          best_offload->label() + ") " + percent_slower(*best_offload, *rec) + " slower.";
    }
  }
  if (rec->strategy == PlanStrategy::kTpPp && rec->pp > 1) {
    out +=
        " The shardtrain TOML runs the whole layout, ZeRO-1 across the data-parallel ranks. "
        "Under Megatron-LM or "
        "Megatron-DeepSpeed the ds_config.json covers its data-parallel part; the accelerate "
        "YAML uses the Megatron-LM plugin.";
  }
  return out;
}

}  // namespace

Plan make_plan(const PlanModel& model, const ClusterOptions& cluster,
               const WorkloadOptions& workload) {
  check_inputs(cluster, workload);
  Plan plan;
  plan.model = model;
  plan.cluster = cluster;
  plan.workload = workload;
  plan.hardware = cluster.has_custom_ ? cluster.custom_ : hardware_spec(cluster.gpu_);
  for (const Candidate& shape : shapes(model, cluster, workload)) {
    plan.candidates.push_back(evaluate_candidate(shape, model, plan.hardware, cluster, workload));
  }
  // The fastest that fits; within 10% of it, the simpler (earlier in the list) wins: the estimates
  // do not separate candidates closer than that (bench/results/planner.md), and simpler strategies
  // have fewer overheads that the model leaves out (launches, synchronization, bookkeeping).
  double best = 0;
  for (const auto& c : plan.candidates) {
    if (c.fits) best = std::max(best, c.tokens_per_s);
  }
  for (size_t i = 0; i < plan.candidates.size(); ++i) {
    if (plan.candidates[i].fits && plan.candidates[i].tokens_per_s >= 0.90 * best) {
      plan.recommended = static_cast<int>(i);
      break;
    }
  }
  plan.explanation = explain(plan, plan.hardware.memory_bytes * (1.0 - workload.safety_margin_));
  return plan;
}

}  // namespace shardtrain
