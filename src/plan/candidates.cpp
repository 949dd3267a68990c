// One candidate's per-device memory and step time (docs/planner.md, "Candidates" and "Time").
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "model/chunked_loss.h"
#include "plan/text.h"
#include "plan/time_model.h"
#include "shardtrain/plan.h"

namespace shardtrain {
namespace {

// Host memory bandwidth per node that a CPU optimizer step streams through (8-channel DDR5).
constexpr double kHostMemoryBandwidth = 200e9;
// Communication buckets in flight (DDP's 25 MiB default; ZeRO's reduce/all-gather buckets of 5e7
// elements as the emitted ds_config.json sets them): two at a time.
constexpr double kDdpBucketBytes = 25.0 * (1 << 20);
constexpr double kZeroBucketElements = 5e7;

int zero_stage(PlanStrategy s) {
  switch (s) {
    case PlanStrategy::kDdp:
      return 0;
    case PlanStrategy::kZero1:
    case PlanStrategy::kTpPp:  // the data-parallel axis shards optimizer state (Megatron's)
      return 1;
    case PlanStrategy::kZero2:
      return 2;
    case PlanStrategy::kFullShard:
    case PlanStrategy::kHybridShard:
      return 3;
  }
  return 0;
}

double ceil_div(double a, double b) { return std::ceil(a / b); }

// Bytes per logit at the loss's peak. bf16 (the Python stacks: bf16 logits, cross-entropy on an
// fp32 copy): the bf16 logits, the fp32 log-softmax output it saves and that output's gradient,
// alive together in backward. bf16-autocast (shardtrain's loss): the bf16 logits and the fp32
// copy the loss reads. fp32: the logits.
double logit_bytes(const std::string& precision) {
  return precision == "bf16" ? 10.0 : precision == "fp32" ? 4.0 : 6.0;
}

Candidate invalid(Candidate c, std::string why) {
  c.valid = false;
  c.fits = false;
  c.note = std::move(why);
  return c;
}

}  // namespace

std::string to_string(PlanStrategy strategy) {
  switch (strategy) {
    case PlanStrategy::kDdp:
      return "ddp";
    case PlanStrategy::kZero1:
      return "zero1";
    case PlanStrategy::kZero2:
      return "zero2";
    case PlanStrategy::kFullShard:
      return "full_shard";
    case PlanStrategy::kHybridShard:
      return "hybrid_shard";
    case PlanStrategy::kTpPp:
      return "tp_pp";
  }
  return "unknown";
}

std::string Candidate::label() const {
  std::string s;
  switch (strategy) {
    case PlanStrategy::kDdp:
      s = "DDP";
      break;
    case PlanStrategy::kZero1:
      s = "ZeRO-1";
      break;
    case PlanStrategy::kZero2:
      s = lora ? "FSDP shard_grad_op" : "ZeRO-2";
      break;
    case PlanStrategy::kFullShard:
      s = lora ? "FSDP full_shard" : "ZeRO-3 / FSDP full_shard";
      if (tp > 1) s = "FSDP full_shard x TP" + std::to_string(tp);
      break;
    case PlanStrategy::kHybridShard:
      s = "FSDP hybrid_shard " + std::to_string(shard) + "x" +
          std::to_string(dp / std::max(1, shard));
      break;
    case PlanStrategy::kTpPp:
      s = "TP" + std::to_string(tp) + " x PP" + std::to_string(pp) + " x DP" + std::to_string(dp);
      break;
  }
  if (lora) s = "LoRA " + s;
  if (cp > 1) s += " x CP" + std::to_string(cp);
  if (ep > 1) s += " x EP" + std::to_string(ep);
  return offload ? s + " + offload" : s;
}

Candidate evaluate_candidate(Candidate c, const PlanModel& model, const HardwareSpec& hw,
                             const ClusterOptions& cluster, const WorkloadOptions& w) {
  const int world = cluster.world_size();
  const int k = cluster.gpus_per_node_;
  const PrecisionBytes b = PrecisionBytes::of(w.precision_, w.optimizer_, w.fp32_grads_);
  if (world % (c.tp * c.pp * c.cp) != 0) {
    return invalid(c,
                   "world size " + std::to_string(world) +
                       " is not divisible by tp x pp x cp = " + std::to_string(c.tp * c.pp * c.cp));
  }
  if (c.cp > 1 && (w.seq_len_ % (2 * c.cp) != 0 || c.strategy == PlanStrategy::kHybridShard)) {
    return invalid(c, "cp=" + std::to_string(c.cp) +
                          " needs a sequence length divisible by 2 x cp, and no hybrid_shard");
  }
  if (model.data_parallel_only && (c.tp > 1 || c.pp > 1 || c.cp > 1 || c.ep > 1)) {
    return invalid(c,
                   "a masked-language model (BERT) trains under data parallelism only in this "
                   "version");
  }
  if (model.n_experts > 0 && c.cp > 1) {
    return invalid(c, "a mixture-of-experts model trains with cp = 1 in this version");
  }
  if (c.ep > 1 && (model.n_experts % c.ep != 0 || (world / (c.tp * c.pp)) % c.ep != 0)) {
    return invalid(c, "ep=" + std::to_string(c.ep) + " must divide the experts (" +
                          std::to_string(model.n_experts) + ") and the data-parallel devices");
  }
  if (c.tp > k || k % c.tp != 0 || model.n_heads % c.tp != 0 || model.n_kv_heads % c.tp != 0) {
    return invalid(c, "tp=" + std::to_string(c.tp) + " must divide the devices per node (" +
                          std::to_string(k) + ") and the heads (" + std::to_string(model.n_heads) +
                          ", kv " + std::to_string(model.n_kv_heads) + ")");
  }
  if (c.tp > 1 && (model.ffn_hidden % c.tp != 0 || w.seq_len_ % c.tp != 0)) {
    return invalid(c, "tp=" + std::to_string(c.tp) + " must divide the FFN width (" +
                          std::to_string(model.ffn_hidden) + ") and, for sequence parallelism, " +
                          "the sequence length (" + std::to_string(w.seq_len_) + ")");
  }
  if (c.pp > 1 && w.virtual_stages_ > 1 && model.n_layers % (c.pp * w.virtual_stages_) != 0) {
    return invalid(c, "pp=" + std::to_string(c.pp) + " x " + std::to_string(w.virtual_stages_) +
                          " virtual stages does not divide " + std::to_string(model.n_layers) +
                          " layers");
  }
  if (c.pp > model.n_layers) {
    return invalid(c, "pp=" + std::to_string(c.pp) + " is more stages than the " +
                          std::to_string(model.n_layers) + " layers");
  }
  c.dp = world / (c.tp * c.pp * c.cp);
  const int dp_cp = c.dp * c.cp;  // the ranks whose gradients are summed
  const int64_t global = w.global_batch_ > 0 ? w.global_batch_ : w.micro_batch_ * world;
  if (global % (w.micro_batch_ * c.dp) != 0) {
    return invalid(
        c, "global batch " + std::to_string(global) +
               " is not a multiple of micro_batch x dp = " + std::to_string(w.micro_batch_ * c.dp));
  }
  c.grad_accum = global / (w.micro_batch_ * c.dp);
  if (c.strategy == PlanStrategy::kHybridShard && cluster.nodes_ < 2) {
    return invalid(c, "hybrid_shard needs several nodes (on one it is full_shard)");
  }
  if (c.offload && hw.name == "cpu") return invalid(c, "a CPU host has nothing to offload to");

  // ---- memory ----
  const int stage = zero_stage(c.strategy);
  const bool sp = c.tp > 1;  // tensor parallel runs with sequence parallelism
  const double d = static_cast<double>(model.d_model);
  // A split that is not even: the largest stage, which the others wait for.
  const double blocks = static_cast<double>((model.n_layers + c.pp - 1) / c.pp);
  // Under expert parallelism a device holds ep-th of the experts of each of its blocks.
  const double experts = static_cast<double>(model.expert_block_parameters());
  const double block =
      (static_cast<double>(model.block_parameters) - experts + experts / c.ep) / c.tp;
  // With pp > 1 the first stage holds the embedding and the last the head: each one matrix.
  double root = static_cast<double>(model.root_parameters);
  if (c.pp > 1) root = std::min(root, static_cast<double>(model.vocab_size) * d);
  root /= c.tp;
  const double replica = blocks * block + root;  // parameters one device's model copy has
  c.shard = c.strategy == PlanStrategy::kHybridShard ? k / (c.tp * c.pp) : (stage == 0 ? 1 : dp_cp);
  if (c.strategy == PlanStrategy::kHybridShard && c.shard * c.tp * c.pp != k) c.shard = c.dp;
  ZeroMemoryInputs zi;
  zi.parameters = replica;
  zi.n = c.shard;
  zi.stage = stage;
  // Flat parameters: one per block and one for the rest, each padded to a multiple of n. A
  // block's experts (ep-th of them) are sharded over the shard / ep devices holding the same.
  const double expert_shard = std::max(1, c.shard / c.ep);
  const double held_experts = experts / c.ep / c.tp;
  zi.sharded_parameters = c.ep > 1 ? blocks * (ceil_div(block - held_experts, c.shard) +
                                               ceil_div(held_experts, expert_shard)) +
                                         ceil_div(root, c.shard)
                                   : blocks * ceil_div(block, c.shard) + ceil_div(root, c.shard);
  zi.largest_layer = std::max(block, root);  // FSDP gathers a whole unit
  zi.offload_optimizer = c.offload;
  zi.offload_params = c.offload && stage == 3;
  // LoRA: the adapters are the model states that train; the frozen base is parameters alone,
  // in its own dtype, sharded by FSDP (stages 2 and 3 here) and gathered a unit at a time
  // (full_shard) or for the whole step (shard_grad_op keeps every unit gathered from its
  // forward to the end of backward).
  c.lora = w.lora_rank_ > 0;
  const double adapters =
      c.lora ? blocks * static_cast<double>(model.block_lora_parameters(w.lora_rank_)) / c.tp : 0;
  // NF4: a 4-bit code per value, an 8-bit scale per 64 and an fp32 scale per 64 x 256.
  const double base_bytes = w.lora_base_ == "fp32"  ? 4.0
                            : w.lora_base_ == "nf4" ? 33.0 / 64.0 + 4.0 / (64.0 * 256.0)
                                                    : 2.0;
  const double trained = c.lora ? adapters : replica;  // what has gradients and optimizer state
  const double base_replica = blocks * block * base_bytes + root * 4.0;  // LoRA's frozen bytes
  if (c.lora) {
    ZeroMemoryInputs za = zi;
    za.parameters = adapters;
    za.sharded_parameters = blocks * ceil_div(adapters / blocks, c.shard);
    za.largest_layer = adapters / blocks;
    c.memory = zero_model_states(za, b, ZeroAccounting::kEngine);
    // lora.base_dtype stores the blocks' linear weights; embeddings and head stay fp32.
    const double shard_of_base =
        blocks * ceil_div(block, c.shard) * base_bytes + ceil_div(root, c.shard) * 4.0;
    if (stage == 0) {
      c.memory.params += base_replica;
    } else if (stage == 3) {
      c.memory.params += shard_of_base + std::max(base_bytes * block, 4.0 * root);  // one unit
    } else {
      c.memory.params += shard_of_base + base_replica;
    }
  } else {
    c.memory = zero_model_states(zi, b, ZeroAccounting::kEngine);
  }
  if (stage == 3) {
    c.memory.temporary += (c.lora ? base_bytes : b.param) * block;  // the next unit, prefetched
  } else if (stage == 0) {
    c.memory.temporary += std::min(2 * kDdpBucketBytes, b.grad * trained);
  } else {
    c.memory.temporary += std::min(2 * kZeroBucketElements, trained) * b.grad;
  }
  const double act_scale = w.precision_ == "fp32" ? 2.0 : 1.0;  // 4-byte activations
  // Under context parallelism a device holds seq_len / cp tokens of each sequence, and its
  // attention keeps no [seq x seq] tensor (the ring runs the blockwise kernel).
  const int64_t seq_local = w.seq_len_ / c.cp;
  const bool fused_attention = w.fused_attention_ || c.cp > 1;
  const int in_flight = c.pp > 1 ? static_cast<int>(std::min<int64_t>(c.pp, c.grad_accum)) : 1;
  const double whole_block =
      block_activation_bytes(model, seq_local, w.micro_batch_, false, fused_attention, c.tp, sp);
  const double per_block =
      w.selective_ ? selective_block_activation_bytes(model, seq_local, w.micro_batch_, c.tp, sp)
                   : block_activation_bytes(model, seq_local, w.micro_batch_, w.checkpointing_,
                                            fused_attention, c.tp, sp);
  const double sb = static_cast<double>(seq_local * w.micro_batch_);
  double act = blocks * per_block * in_flight;
  // One block's activations rebuilt at a time during backward: all of them, or what selective
  // checkpointing did not keep.
  if (w.checkpointing_ || w.selective_) act += whole_block - (w.selective_ ? per_block : 0.0);
  // Final norm input, and the logits with the fp32 copy the loss reads: of every token, or of
  // one chunk of about 32 MiB of fp32 logits (the chunked loss, which also accumulates the
  // hidden states' gradient, 4 bytes a value).
  const double vocab_local = static_cast<double>(model.vocab_size) / c.tp;
  double logit_rows = sb;
  if (w.chunked_loss_) {
    logit_rows =
        std::min(sb, static_cast<double>(detail::loss_chunk_tokens(model.vocab_size / c.tp)));
    act += 2 * sb * d;
  }
  act += 4 * sb * d + logit_bytes(w.precision_) * logit_rows * vocab_local;
  c.memory.activations = act * act_scale;
  c.host_bytes_per_node = c.memory.host * k;
  const double usable = hw.memory_bytes * (1.0 - w.safety_margin_);
  const double host_mem = cluster.host_memory_ > 0 ? cluster.host_memory_ : hw.host_memory_bytes;
  if (c.memory.total() > usable) {
    c.note = "needs " + detail::gb(c.memory.total()) + " per device, more than the usable " +
             detail::gb(usable);
  } else if (c.host_bytes_per_node > host_mem * (1.0 - w.safety_margin_)) {
    c.note = "offloaded state needs " + detail::gb(c.host_bytes_per_node) +
             " of host memory per node, more than the usable " +
             detail::gb(host_mem * (1.0 - w.safety_margin_));
  } else {
    c.fits = true;
  }

  // ---- time ----
  const LinkSpec intra =
      link_spec(cluster.intra_.empty() ? hw.default_intra : cluster.intra_, hw.name);
  const LinkSpec inter = link_spec(cluster.inter_);
  const double eff = w.efficiency_ > 0 ? w.efficiency_ : modelled_efficiency(hw, model.d_model);
  const double peak = (w.precision_ == "fp32" ? hw.peak_fp32_flops : hw.peak_bf16_flops) * eff;
  double flops_token = detail::training_flops_per_token(model, w.seq_len_, w.checkpointing_);
  const double forward_flops = detail::training_flops_per_token(model, w.seq_len_, false) / 3.0;
  // Selective checkpointing runs the forward of the matmuls it did not keep again.
  if (w.selective_) {
    flops_token +=
        2.0 * static_cast<double>(model.n_layers) * selective_recomputed_parameters(model);
  }
  // LoRA computes no weight gradients of the base: of backward's two forwards' worth, the input
  // gradients alone (adapters' own FLOPs are rank / d of that and left out).
  if (c.lora) flops_token -= forward_flops;
  // The largest pipeline stage sets the pace.
  const double stage_share =
      blocks * static_cast<double>(c.pp) / static_cast<double>(model.n_layers);
  const double t_mb = sb * flops_token * stage_share / (c.tp * c.pp) / peak;
  const double t_fwd = t_mb * forward_flops / flops_token;
  const double t_bwd = t_mb - t_fwd;
  const double ga = static_cast<double>(c.grad_accum);
  const double shard_params = c.lora ? (stage == 0 ? adapters : adapters / c.shard)
                                     : (stage == 0 ? replica : zi.sharded_parameters);
  const double g_opt = b.master > 0 ? 4.0 : b.grad;
  const double opt_bytes =
      (b.param + g_opt + b.optimizer_total()) + (b.param + b.optimizer_total());
  // Elementwise work (norms, activations, softmax, the loss) is bandwidth-bound: every stored
  // activation byte is written once in forward and read about twice in backward; a recomputed
  // forward writes them once more.
  const double full_act =
      (blocks * block_activation_bytes(model, seq_local, w.micro_batch_, false, fused_attention,
                                       c.tp, sp) +
       4 * sb * d + (w.precision_ == "fp32" ? 4.0 : 6.0) * sb * model.vocab_size / c.tp) *
      act_scale;
  const double t_elementwise =
      full_act * (w.checkpointing_ || w.selective_ ? 4.0 : 3.0) / hw.memory_bw;
  c.time.compute =
      ga * (t_mb + t_elementwise) + (c.offload ? 0.0 : shard_params * opt_bytes / hw.memory_bw);

  // Mesh order, innermost first: tp, dp, pp. A data-parallel group has k / tp ranks per node.
  const auto dp_link =
      detail::group_link(dp_cp, std::min(dp_cp, std::max(1, k / c.tp)), cluster, intra, inter);
  // Under LoRA only adapter gradients are reduced; the frozen base is gathered but never
  // updated, so gathering it again after the step is not needed (ZeRO-2's all-gather).
  const double G = b.grad * trained;
  const double P = c.lora ? base_replica + b.param * adapters : b.param * replica;
  double comm = 0, exposed = 0;
  switch (c.strategy) {
    case PlanStrategy::kDdp: {
      const double ar = detail::all_reduce_time(G, dp_cp, dp_link);
      const double last = detail::all_reduce_time(std::min(G, kDdpBucketBytes), dp_cp, dp_link);
      comm = ar;
      exposed = std::min(ar, std::max(0.0, ar - t_bwd) + last);
      break;
    }
    case PlanStrategy::kZero1:
    case PlanStrategy::kTpPp: {
      const double rs = detail::all_gather_time(G, dp_cp, dp_link);
      const double ag = detail::all_gather_time(P, dp_cp, dp_link);
      comm = rs + ag;
      // Megatron's distributed optimizer gathers the updated parameters bucket by bucket while
      // the next step's first forward runs (--overlap-param-gather); DeepSpeed's ZeRO-1 waits.
      exposed = std::max(0.0, rs - t_bwd) +
                (c.strategy == PlanStrategy::kTpPp ? std::max(0.0, ag - t_fwd) : ag);
      break;
    }
    case PlanStrategy::kZero2: {
      const double rs = detail::all_gather_time(G, dp_cp, dp_link);
      const double ag = detail::all_gather_time(P, dp_cp, dp_link);
      // A LoRA base is gathered for every forward (shard_grad_op frees it when backward ends);
      // ZeRO-2 gathers the updated parameters once, after the step.
      const double gathers = c.lora ? ga : 1.0;
      comm = ga * rs + gathers * ag;
      exposed = ga * std::max(0.0, rs - t_bwd) + gathers * ag;
      break;
    }
    case PlanStrategy::kFullShard:
    case PlanStrategy::kHybridShard: {
      const auto link = c.strategy == PlanStrategy::kHybridShard
                            ? detail::group_link(c.shard, c.shard, cluster, intra, inter)
                            : dp_link;
      const double ag = detail::all_gather_time(P, c.shard, link);
      const double rs = detail::all_gather_time(G, c.shard, link);
      const double first = ag * zi.largest_layer / replica;  // the first unit is not hidden
      comm = ga * (2 * ag + rs);
      exposed = ga * (std::max(0.0, ag - t_fwd) + std::max(0.0, ag + rs - t_bwd) + first);
      if (c.strategy == PlanStrategy::kHybridShard) {
        const int replicas = c.dp / c.shard;
        const auto rep_link = detail::group_link(replicas, 1, cluster, intra, inter);
        const double ar = detail::all_reduce_time(G / c.shard, replicas, rep_link);
        comm += ar;
        exposed += std::max(0.0, ag + rs + ar - t_bwd) - std::max(0.0, ag + rs - t_bwd);
      }
      break;
    }
  }
  double tp_pp_mb = 0;   // per micro-batch, on the critical path
  double tp_hidden = 0;  // of that, what overlaps with the matmuls (--tp-overlap)
  if (c.tp > 1) {
    const auto tp_link = detail::group_link(c.tp, c.tp, cluster, intra, inter);
    // Two all-gathers and two reduce-scatters per block forward and backward, under sequence
    // parallelism as much as two all-reduces each way; a recomputed forward gathers again (once
    // of the two under selective checkpointing, which keeps the attention's output).
    const double per_layer = (w.checkpointing_ ? 6
                              : w.selective_   ? 5
                                               : 4) *
                             detail::all_reduce_time(2 * sb * d, c.tp, tp_link);
    tp_pp_mb += blocks * per_layer;
    // Overlapped with the matmuls that consume and produce the gathered activations (Megatron's
    // --tp-comm-overlap, torchtitan's async TP): what the micro-batch's compute covers.
    if (w.tp_overlap_) tp_hidden = std::min(blocks * per_layer, t_mb);
  }
  if (c.cp > 1) {
    // The ring: per layer, cp - 1 hops of this device's keys and values forward (again when
    // recomputed), cp - 1 backward and cp hops of their fp32 gradients; hidden behind the
    // attention computed meanwhile, the rest on the critical path.
    const auto ring_link =
        detail::group_link(c.cp, std::min(c.cp, std::max(1, k / c.tp)), cluster, intra, inter);
    const double kv = 2.0 * sb * model.n_kv_heads * (d / model.n_heads) / c.tp;
    const double hop = detail::p2p_time(kv * (w.precision_ == "fp32" ? 4.0 : 2.0), ring_link);
    const double grads_hop = detail::p2p_time(kv * 4.0, ring_link);
    const double per_layer = (c.cp - 1) * hop * (w.checkpointing_ ? 3.0 : 2.0) + c.cp * grads_hop;
    const double attention_share = 4.0 * d * static_cast<double>(w.seq_len_) /
                                   (2.0 * static_cast<double>(model.block_parameters) +
                                    4.0 * d * static_cast<double>(w.seq_len_));
    const double ring = blocks * per_layer;
    comm += ga * ring;
    exposed += ga * std::max(0.0, ring - t_mb * attention_share);
  }
  if (c.ep > 1) {
    // Each MoE layer sends every token's rows to its k experts and takes them back: two
    // all-to-alls forward, two backward (and two more when recomputed), on the critical path.
    const auto ep_link =
        detail::group_link(c.ep, std::min(c.ep, std::max(1, k / c.tp)), cluster, intra, inter);
    const double rows = sb * static_cast<double>(model.experts_per_token) * d *
                        (w.precision_ == "fp32" ? 4.0 : 2.0);
    tp_pp_mb += blocks * (w.checkpointing_ ? 6 : 4) * detail::all_to_all_time(rows, c.ep, ep_link);
  }
  // Interleaved: v chunks per device, each micro-batch crossing v times as many boundaries.
  // The schedule needs a multiple of pp micro-batches (otherwise 1F1B runs, as emitted).
  const double v =
      c.pp > 1 && c.grad_accum % c.pp == 0 ? static_cast<double>(w.virtual_stages_) : 1.0;
  if (c.pp > 1) {
    const bool across_nodes = c.tp * c.dp >= k && cluster.nodes_ > 1;
    const auto pp_link = across_nodes ? detail::group_link(2, 1, cluster, intra, inter)
                                      : detail::group_link(2, 2, cluster, intra, inter);
    tp_pp_mb += 2 * v * detail::p2p_time(2 * sb * d, pp_link);
  }
  comm += ga * tp_pp_mb;
  exposed += ga * (tp_pp_mb - tp_hidden);
  c.time.bubble = (c.pp - 1) * (t_mb + tp_pp_mb) / v;
  c.time.communication = comm;
  c.time.exposed_comm = exposed;

  if (c.offload) {
    // H100 and H200 servers attach GPUs over PCIe 5, A100 and RTX 4090 ones over PCIe 4.
    const bool gen5 = hw.name.rfind("h1", 0) == 0 || hw.name.rfind("h2", 0) == 0;
    const LinkSpec host_link = link_spec(gen5 ? "pcie5" : "pcie4");
    double moved = ga * b.grad * shard_params + b.param * shard_params;
    if (stage == 3) moved += ga * 2 * b.param * shard_params;  // params fetched fwd and bwd
    const double host_opt_bytes = (g_opt + b.optimizer_total()) + b.optimizer_total();
    c.time.offload =
        moved / host_link.bandwidth + shard_params * host_opt_bytes / (kHostMemoryBandwidth / k);
  }
  c.time.total = c.time.compute + c.time.exposed_comm + c.time.offload + c.time.bubble;
  c.tokens_per_s = static_cast<double>(global * w.seq_len_) / c.time.total;
  const double ideal = static_cast<double>(global * w.seq_len_) * flops_token / (world * peak);
  c.scaling_efficiency = ideal / c.time.total;
  return c;
}

}  // namespace shardtrain
