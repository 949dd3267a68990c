// The planner: per-device memory and step-time estimates for every parallel strategy on a given
// cluster, a recommended strategy with the reasons for it, and the configs that run it. All of it
// is arithmetic on shapes and published hardware figures; nothing here allocates a model or
// touches a device. docs/planner.md derives every formula.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/model.h"

namespace shardtrain {

// ---- Hardware -------------------------------------------------------------------------------

// One accelerator kind (or one CPU core for the "cpu" entry). Figures are vendors' published
// dense (no sparsity) peaks, or, for "cpu", what bench/results/planner.md measured.
struct HardwareSpec {
  std::string name;              // "h100-80gb", ...
  double memory_bytes = 0;       // device memory (GB as vendors state it, 1e9 bytes)
  double peak_bf16_flops = 0;    // per second
  double peak_fp32_flops = 0;    // per second
  double memory_bw = 0;          // device memory bandwidth, bytes/s
  double host_memory_bytes = 0;  // CPU memory per node assumed when the user gives none
  std::string default_intra;     // the intra-node link such machines usually have
  // Achieved fraction of peak FLOP/s on a transformer step's matmuls, fitted to published runs
  // (docs/planner.md, "Published runs"): at d_model 4096, and its change per doubling of
  // d_model (larger matmuls run closer to peak). modelled_efficiency() applies it.
  double default_efficiency = 0.4;
  double efficiency_per_doubling = 0;
  std::string source;  // where the figures come from
};
// Throws std::invalid_argument listing the known kinds.
const HardwareSpec& hardware_spec(const std::string& kind);
// The fitted efficiency for a model of this width, kept within [0.2, 0.8] (1 for measured hosts).
double modelled_efficiency(const HardwareSpec& hw, int64_t d_model);
const std::vector<HardwareSpec>& hardware_table();

// A link: bandwidth per direction available to one device (intra-node) or one node
// (inter-node), bytes/s, and the latency of one ring step, seconds.
struct LinkSpec {
  std::string name;
  double bandwidth = 0;
  double latency = 0;
};
// "nvlink" (per GPU kind), "pcie3", "pcie4", "pcie5", "loopback" (Gloo over local TCP), "ib",
// "ethernet". `gpu` picks the NVLink generation. Throws std::invalid_argument for other names.
LinkSpec link_spec(const std::string& name, const std::string& gpu = "");

// Measures this host: one rank of `threads` threads as a device (fp32 and bf16 GEMM FLOP/s,
// copy bandwidth; memory = physical memory / cores x threads). Takes a few seconds; sets
// LibTorch's intra-op thread count meanwhile (restored after), so call it with no other LibTorch
// work running in the process.
HardwareSpec measure_cpu_host(int threads = 1);

// ---- Inputs ---------------------------------------------------------------------------------

// What the planner needs of a model: sizes, and the parameter count per sharding unit (one
// transformer block; everything else is the root unit).
struct PlanModel {
  std::string name;
  int64_t num_parameters = 0;
  int64_t block_parameters = 0;  // one transformer block
  int64_t root_parameters = 0;   // embeddings, final norm, untied head
  int64_t largest_layer = 0;     // largest single weight matrix or embedding, parameters
  int64_t n_layers = 0, d_model = 0, n_heads = 0, n_kv_heads = 0, ffn_hidden = 0;
  int64_t head_dim = 0;  // 0: d_model / n_heads (Qwen3's are wider)
  int64_t vocab_size = 0;
  bool gated_mlp = false;  // SwiGLU (Llama) rather than GELU (GPT-2)
  double dropout = 0.0;
  // A masked-language model (BERT), which this version splits by data parallelism only: its
  // tensor, pipeline, context and expert parallelism candidates are marked invalid.
  bool data_parallel_only = false;
  // A mixture-of-experts model: the experts each token passes (experts_per_token, plus the
  // shared ones as multiples of ffn_hidden), and the parameters one token computes with, in one
  // block and in all. Memory counts every parameter; FLOPs the active ones. Dense: 0, 0, and
  // the active counts equal the totals.
  int64_t experts_per_token = 0, shared_experts = 0, n_experts = 0;
  int64_t active_block_parameters = 0;
  int64_t active_parameters = 0;
  // The routed experts' parameters in one block (SwiGLU: 3 x d_model x ffn_hidden each); 0 for a
  // dense model. Expert parallelism splits these.
  int64_t expert_block_parameters() const { return n_experts * 3 * d_model * ffn_hidden; }
  std::string preset;     // how an emitted config names the model: a preset name,
  std::string hf_config;  // or a Hugging Face config.json (both empty for bare shapes)

  static PlanModel from_config(const ModelConfig& config);
  // A bare parameter count with layer shapes (ffn_hidden 0: 4 d_model; n_kv_heads 0: n_heads).
  // Throws std::invalid_argument when the shapes need more parameters than `num_parameters`.
  // LoRA adapters of rank `rank` on every linear layer of one block: rank x (in + out) summed.
  int64_t block_lora_parameters(int64_t rank) const;
  static PlanModel from_shapes(int64_t num_parameters, int64_t n_layers, int64_t d_model,
                               int64_t n_heads, int64_t n_kv_heads, int64_t ffn_hidden,
                               int64_t vocab_size, bool gated_mlp);
};

struct ClusterOptions {
  ClusterOptions& gpu(std::string v) {
    gpu_ = std::move(v);
    return *this;
  }
  ClusterOptions& gpus_per_node(int v) {
    gpus_per_node_ = v;
    return *this;
  }
  ClusterOptions& nodes(int v) {
    nodes_ = v;
    return *this;
  }
  // Intra-node link: "nvlink", "pcie3", "pcie4", "pcie5", "loopback"; "": the device's usual one.
  ClusterOptions& intra(std::string v) {
    intra_ = std::move(v);
    return *this;
  }
  // Inter-node network: "ib" or "ethernet".
  ClusterOptions& inter(std::string v) {
    inter_ = std::move(v);
    return *this;
  }
  // Per node, bytes/s; 0: 50 GB/s (400 Gb/s) per device for ib, 12.5 GB/s per node for ethernet.
  ClusterOptions& inter_bandwidth(double bytes_per_s) {
    inter_bw_ = bytes_per_s;
    return *this;
  }
  // Per node, bytes; 0: the hardware entry's.
  ClusterOptions& host_memory(double bytes) {
    host_memory_ = bytes;
    return *this;
  }
  // Replaces the table entry (the "cpu" entry measured here, or a custom device).
  ClusterOptions& hardware(HardwareSpec v) {
    custom_ = std::move(v);
    has_custom_ = true;
    return *this;
  }

  std::string gpu_ = "h100-80gb";
  int gpus_per_node_ = 8;
  int nodes_ = 1;
  std::string intra_;
  std::string inter_ = "ib";
  double inter_bw_ = 0;
  double host_memory_ = 0;  // per node, bytes; 0: the hardware entry's
  HardwareSpec custom_;
  bool has_custom_ = false;
  int world_size() const { return gpus_per_node_ * nodes_; }
};

struct WorkloadOptions {
  WorkloadOptions& seq_len(int64_t v) {
    seq_len_ = v;
    return *this;
  }
  WorkloadOptions& micro_batch(int64_t v) {
    micro_batch_ = v;
    return *this;
  }
  // Sequences per optimizer step; 0: micro_batch x all devices (no accumulation with pure data
  // parallelism).
  WorkloadOptions& global_batch(int64_t v) {
    global_batch_ = v;
    return *this;
  }
  // "bf16": bf16 params and grads, fp32 master weights (mixed precision); "fp32"; "bf16-autocast":
  // fp32 params and grads, bf16 compute (what the shardtrain trainer does on CPU).
  WorkloadOptions& precision(std::string v) {
    precision_ = std::move(v);
    return *this;
  }
  // "adamw" (or "adam") or "sgd" (with momentum).
  WorkloadOptions& optimizer(std::string v) {
    optimizer_ = std::move(v);
    return *this;
  }
  // Gradients accumulated and reduced in fp32 beside bf16 weights (Megatron-LM's main_grad, its
  // default with bf16): 18 bytes per parameter replicated, 6 + 12/d with ZeRO-1 (Megatron's
  // distributed optimizer). Only with precision "bf16".
  WorkloadOptions& fp32_grads(bool v) {
    fp32_grads_ = v;
    return *this;
  }
  WorkloadOptions& activation_checkpointing(bool v) {
    checkpointing_ = v;
    return *this;
  }
  // Selective activation checkpointing, torchtitan's per-operator policy: a block keeps its input,
  // the output of every other matmul and the attention's output, and recomputes the rest (the
  // other matmuls, norms, activation functions) in backward. Not with activation_checkpointing.
  WorkloadOptions& selective_checkpointing(bool v) {
    selective_ = v;
    return *this;
  }
  // Attention through a fused kernel that keeps no [seq x seq] score matrix (FlashAttention).
  WorkloadOptions& fused_attention(bool v) {
    fused_attention_ = v;
    return *this;
  }
  // The loss over chunks of the head's logits (shardtrain's train.chunked_loss): about 32 MiB
  // of them at a time instead of [tokens x vocabulary]. Off by default, as the published runs
  // and the Python stacks hold the whole logits.
  WorkloadOptions& chunked_loss(bool v) {
    chunked_loss_ = v;
    return *this;
  }
  // Interleaved pipeline schedules: each device holds this many stages of layers/(pp x v)
  // blocks; the bubble shrinks by v and activations cross v times as many stage boundaries
  // (shardtrain's parallel.pp_virtual_stages, Megatron's virtual pipeline size).
  WorkloadOptions& virtual_stages(int v) {
    virtual_stages_ = v;
    return *this;
  }
  // Tensor-parallel collectives overlapped with the matmuls around them (Megatron-LM's
  // --tp-comm-overlap, torchtitan's async TP); otherwise they are on the critical path.
  WorkloadOptions& tp_overlap(bool v) {
    tp_overlap_ = v;
    return *this;
  }
  // Achieved fraction of peak FLOP/s; 0: the hardware entry's default.
  WorkloadOptions& efficiency(double v) {
    efficiency_ = v;
    return *this;
  }
  WorkloadOptions& safety_margin(double v) {
    safety_margin_ = v;
    return *this;
  }
  // LoRA fine-tuning: adapters of this rank on every linear layer of the blocks train, the rest
  // is frozen, its blocks' weights stored in `base` ("fp32", "bf16" or "nf4": QLoRA), embeddings
  // and head in fp32; 0: every parameter trains. Candidates are
  // then the LoRA branch of the decision tree: DDP, FSDP shard_grad_op, FSDP full_shard.
  WorkloadOptions& lora(int64_t rank, std::string base = "bf16") {
    lora_rank_ = rank;
    lora_base_ = std::move(base);
    return *this;
  }

  int64_t seq_len_ = 2048, micro_batch_ = 1, global_batch_ = 0;
  std::string precision_ = "bf16";
  std::string optimizer_ = "adamw";
  bool fp32_grads_ = false;
  bool checkpointing_ = false;
  bool selective_ = false;
  bool fused_attention_ = true;
  bool chunked_loss_ = false;
  int virtual_stages_ = 1;
  bool tp_overlap_ = false;
  double efficiency_ = 0;
  double safety_margin_ = 0.1;  // of device memory, for the CUDA context, fragmentation, ...
  int64_t lora_rank_ = 0;
  std::string lora_base_ = "bf16";
};

// ---- Memory math ----------------------------------------------------------------------------

// Bytes per parameter of each model state.
struct PrecisionBytes {
  double param = 2, grad = 2;
  double master = 4;           // fp32 copy of the weights kept by the optimizer (0: none)
  double optimizer_state = 8;  // Adam's two moments in fp32
  double optimizer_total() const { return master + optimizer_state; }  // the ZeRO paper's K
  // From a precision and optimizer name; throws std::invalid_argument for unknown ones. With
  // `fp32_grads`, gradients are accumulated and reduced in fp32 beside bf16 weights (Megatron's
  // main_grad): g = 4, and the optimizer reads them without an fp32 copy.
  static PrecisionBytes of(const std::string& precision, const std::string& optimizer,
                           bool fp32_grads = false);
};

struct MemoryBreakdown {
  double params = 0, grads = 0, optimizer = 0, activations = 0, temporary = 0;  // bytes
  double host = 0;  // moved to host memory by offload (not part of total())
  double model_states() const { return params + grads + optimizer; }
  double total() const { return model_states() + activations + temporary; }
};

// Conventions for model-state memory under ZeRO stage 0 (DDP) to 3 on `n` devices:
// kZeroPaper: Rajbhandari et al. 2020, Sec. 5 - (p + g + K) bytes, each partitioned by its stage.
// kEngine: what DeepSpeed's engine allocates and its estimator counts - the gradient the
// optimizer reads is an fp32 partition when there are master weights, stages 1-2 hold the full
// low-precision gradient before it is reduced, stage 3 gathers the largest layer's params and
// grads. Offload moves optimizer state (and with offload_params the parameters) to the host.
enum class ZeroAccounting { kZeroPaper, kEngine };
struct ZeroMemoryInputs {
  double parameters = 0;     // Psi
  double largest_layer = 0;  // L (kEngine stage 3)
  int n = 1;                 // devices the states are partitioned over
  int stage = 0;             // 0 (DDP) .. 3
  // Parameters of one device's partition when shards are padded (flat parameters padded to a
  // multiple of n per unit); 0: parameters / n.
  double sharded_parameters = 0;
  bool offload_optimizer = false, offload_params = false;
};
MemoryBreakdown zero_model_states(const ZeroMemoryInputs& in, const PrecisionBytes& bytes,
                                  ZeroAccounting accounting);

// Activation bytes kept for backward by one transformer block and one micro-batch, after
// Korthikanti et al. 2022 (16-bit activations, 1-byte dropout masks), generalized to SwiGLU and
// grouped-query attention. tp > 1 with sequence_parallel splits everything by tp; without it
// the norm and dropout terms are replicated. With full recomputation only the block input is kept.
double block_activation_bytes(const PlanModel& model, int64_t seq_len, int64_t micro_batch,
                              bool recompute, bool fused_attention, int tp = 1,
                              bool sequence_parallel = false);

// Under selective checkpointing (WorkloadOptions::selective_checkpointing), with a fused
// attention kernel: the block's input, the outputs of every other matmul in the order a block
// runs them (Llama: q, v, gate, down of q k v o gate up down; GPT-2: qkv and fc of qkv o fc proj),
// the attention's output and its fp32 log-sum-exp, all 2-byte and split by tp with sequence
// parallelism.
double selective_block_activation_bytes(const PlanModel& model, int64_t seq_len,
                                        int64_t micro_batch, int tp = 1,
                                        bool sequence_parallel = false);
// The matmul parameters of one block whose forward selective checkpointing runs again in
// backward (Llama: k, o, up; GPT-2: o, proj), for the FLOPs of the recomputation.
double selective_recomputed_parameters(const PlanModel& model);

// ---- Candidates and the plan ----------------------------------------------------------------

enum class PlanStrategy { kDdp, kZero1, kZero2, kFullShard, kHybridShard, kTpPp };
std::string to_string(PlanStrategy strategy);

struct StepTime {
  double compute = 0;        // FLOPs at the stated efficiency, plus memory-bound optimizer step
  double communication = 0;  // every collective of the step, serialized
  double exposed_comm = 0;   // what overlap does not hide
  double offload = 0;        // host<->device copies and the host optimizer step, not hidden
  double bubble = 0;         // pipeline fill and drain
  double total = 0;
};

struct Candidate {
  PlanStrategy strategy = PlanStrategy::kDdp;
  bool offload = false;  // optimizer state (ZeRO-1/2) or optimizer state and params (ZeRO-3/FSDP)
  bool lora = false;     // LoRA fine-tuning: ZeRO-2 is FSDP shard_grad_op, ZeRO-3 full_shard
  int tp = 1, pp = 1, dp = 1;  // dp = dp_replicate x dp_shard
  // Context parallelism: each sequence split over cp devices (ring attention); the strategy's
  // gradients and shards span dp x cp.
  int cp = 1;
  // Expert parallelism (a mixture-of-experts model): the experts split over ep of the dp
  // devices, tokens exchanged by all-to-all in every MoE layer; the experts' states are sharded
  // over the other dp / ep.
  int ep = 1;
  int shard = 1;  // devices model states are partitioned over
  int64_t grad_accum = 1;
  MemoryBreakdown memory;  // per device, bytes
  double host_bytes_per_node = 0;
  bool valid = true;  // false: the shape does not divide (see note)
  bool fits = false;
  StepTime time;
  double tokens_per_s = 0;
  double scaling_efficiency = 0;  // ideal compute time / step time
  std::string note;               // why invalid or why it does not fit
  std::string label() const;      // "ZeRO-3 / FSDP full_shard + offload", "TP4 x PP2 x DP8"
};

struct Plan {
  PlanModel model;
  ClusterOptions cluster;
  WorkloadOptions workload;
  HardwareSpec hardware;
  std::vector<Candidate> candidates;
  int recommended = -1;     // index into candidates, -1: nothing fits
  std::string explanation;  // why this one, why not the others
  const Candidate* recommendation() const {
    return recommended < 0 ? nullptr : &candidates[static_cast<size_t>(recommended)];
  }
};

// Evaluates every candidate and picks the fastest that fits with the safety margin.
// Throws std::invalid_argument for inconsistent inputs (zero devices, unknown precision, ...).
Plan make_plan(const PlanModel& model, const ClusterOptions& cluster,
               const WorkloadOptions& workload);
// One candidate alone (what make_plan does for each).
Candidate evaluate_candidate(Candidate shape, const PlanModel& model, const HardwareSpec& hw,
                             const ClusterOptions& cluster, const WorkloadOptions& workload);

// ---- Output ---------------------------------------------------------------------------------

std::string format_plan(const Plan& plan);       // the table and the recommendation, for people
std::string plan_to_json(const Plan& plan);      // everything, for tools
std::string memory_chart_svg(const Plan& plan);  // stacked bars of per-device memory
// Configs that run `candidate`: shardtrain TOML, DeepSpeed ds_config.json, accelerate YAML.
std::string shardtrain_toml(const Plan& plan, const Candidate& candidate);
std::string deepspeed_json(const Plan& plan, const Candidate& candidate);
std::string accelerate_yaml(const Plan& plan, const Candidate& candidate);

// ---- Validation against a finished run ------------------------------------------------------

struct ValidationResult {
  std::string strategy;  // the candidate the run maps to
  int world_size = 1;
  double estimated_model_states = 0, measured_model_states = 0;  // bytes per rank, medians
  double estimated_step_time = 0, measured_step_time = 0;        // seconds, medians
  // Peak memory per rank: the planner's total (plus host-memory offload, plus what the process
  // held at start when run.json records it) against the largest mem.peak_rss of any rank.
  double estimated_peak = 0, measured_peak_rss = 0;  // bytes
  int64_t steps = 0;  // steps measured (the first is left out as warm-up when there are more)
  double model_state_error() const;  // (estimate - measured) / measured
  double step_time_error() const;
  double peak_error() const;
};
// Reads RUN_DIR/run.json and RUN_DIR/metrics.jsonl and estimates that exact configuration on
// `host` (one device per rank). Throws std::invalid_argument naming the missing file or key.
ValidationResult validate_run(const std::string& run_dir, const HardwareSpec& host);
std::string format_validation(const ValidationResult& result);

}  // namespace shardtrain
