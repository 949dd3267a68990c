// `plan --validate`: the estimate for a finished run's exact configuration beside what it measured.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/stats.h"
#include "plan/run_estimate.h"
#include "plan/text.h"
#include "shardtrain/config.h"
#include "shardtrain/plan.h"

namespace shardtrain {
namespace {

using nlohmann::json;

json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("cannot read '" + path.string() + "'");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw std::invalid_argument("'" + path.string() + "' is not valid JSON: " + e.what());
  }
}

template <typename T>
T field(const json& j, const char* key, T fallback) {
  return j.contains(key) ? j.at(key).get<T>() : fallback;
}

template <typename T>
T required(const json& j, const char* key, const std::string& file) {
  if (!j.contains(key)) throw std::invalid_argument("'" + file + "' has no key '" + key + "'");
  return j.at(key).get<T>();
}

// The candidate a run's [parallel] section is: fsdp and zero map onto the ZeRO stages. Offload
// is left to estimate_run, which accounts for it as a CPU host has it.
Candidate candidate_of(const json& parallel, int world, const std::string& file) {
  Candidate c;
  const std::string strategy = required<std::string>(parallel, "strategy", file);
  if (strategy == "none" || strategy == "ddp") {
    c.strategy = PlanStrategy::kDdp;
  } else if (strategy == "fsdp") {
    const json f = parallel.value("fsdp", json::object());
    const std::string sharding = f.value("sharding", std::string("full_shard"));
    if (sharding == "full_shard") {
      c.strategy = PlanStrategy::kFullShard;
    } else if (sharding == "shard_grad_op") {
      c.strategy = PlanStrategy::kZero2;
    } else if (sharding == "no_shard") {
      c.strategy = PlanStrategy::kDdp;
    } else if (sharding == "hybrid_shard") {
      c.strategy = PlanStrategy::kHybridShard;
      c.shard = world / std::max(1, f.value("replicate", 1));
    } else {
      throw std::invalid_argument("'" + file + "': unknown parallel.fsdp.sharding '" + sharding +
                                  "'");
    }
  } else if (strategy == "zero") {
    const json z = parallel.value("zero", json::object());
    const int stage = z.value("stage", 1);
    if (stage < 1 || stage > 3) {
      throw std::invalid_argument("'" + file + "': parallel.zero.stage must be 1, 2 or 3, got " +
                                  std::to_string(stage));
    }
    c.strategy = stage == 1   ? PlanStrategy::kZero1
                 : stage == 2 ? PlanStrategy::kZero2
                              : PlanStrategy::kFullShard;
  } else {
    throw std::invalid_argument("'" + file + "': unknown parallel.strategy '" + strategy + "'");
  }
  // Tensor parallelism divides the blocks' and the vocabulary's states by tp; the strategy
  // shards them further over the world / tp data-parallel ranks.
  c.tp = parallel.value("tp", 1);
  if (c.tp < 1 || world % c.tp != 0) {
    throw std::invalid_argument("'" + file + "': parallel.tp=" + std::to_string(c.tp) +
                                " does not divide the world size " + std::to_string(world));
  }
  if (c.strategy == PlanStrategy::kHybridShard) c.shard /= c.tp;
  c.cp = parallel.value("cp", 1);
  c.ep = parallel.value("ep", 1);
  return c;
}

}  // namespace

double ValidationResult::model_state_error() const {
  return (estimated_model_states - measured_model_states) / measured_model_states;
}
double ValidationResult::step_time_error() const {
  return (estimated_step_time - measured_step_time) / measured_step_time;
}
double ValidationResult::peak_error() const {
  return (estimated_peak - measured_peak_rss) / measured_peak_rss;
}

namespace detail {

namespace {

// What this engine holds on a CPU host beyond the planner's per-device model, each term
// measured (bench/results/memory.md):
// - Stage 3 / full_shard: the root unit (embeddings, final norm) stays gathered with its whole
//   gradient through backward (the planner's largest layer), and at the end that gradient is
//   reduced from a flat fp32 buffer of its own; blocks are gathered ahead of use: one more
//   under FSDP, under ZeRO-3 as many as prefetch_bucket_size elements hold.
// - A tied embedding's gradient comes in two parts as large as the embedding, from the head and
//   from the lookup. Under DDP, ZeRO-1 and hybrid_shard the lookup's is formed beside the head's
//   before it is added in; ZeRO-2 and full_shard / ZeRO-3 over one group of several ranks,
//   without tensor or pipeline parallelism, take its rows instead
//   (src/parallel/fsdp/tied_embedding.cpp).
void this_engine_on_cpu(Candidate& c, const PlanModel& model, const WorkloadOptions& w,
                        bool zero_prefetch, int64_t prefetch_elements, bool tied) {
  const bool stage3 =
      c.strategy == PlanStrategy::kFullShard || c.strategy == PlanStrategy::kHybridShard;
  if (stage3) {
    const double block = static_cast<double>(model.block_parameters);
    const double gathered_dtype = w.precision_ == "fp32" ? 4.0 : 2.0;
    double ahead = 1;  // beyond the one block the planner counts
    if (zero_prefetch) {
      ahead = std::floor(static_cast<double>(prefetch_elements) / std::max(block, 1.0));
      ahead = std::min(ahead, static_cast<double>(model.n_layers - 1));
    }
    // One rank holds everything: nothing is gathered, nothing prefetched.
    if (c.shard == 1) ahead = 0;
    // The gathered root unit (fp32 here), which a LoRA candidate already counts with its base.
    c.memory.temporary += (c.lora ? 0.0 : 4.0 * static_cast<double>(model.root_parameters)) +
                          ahead * gathered_dtype * block;
  }
  const bool lookup_rows =
      (c.strategy == PlanStrategy::kZero2 || c.strategy == PlanStrategy::kFullShard) &&
      c.shard > 1 && c.tp <= 1 && c.pp <= 1;
  if (tied && !c.lora && !lookup_rows) {
    const double embedding = 4.0 * static_cast<double>(model.vocab_size) *
                             static_cast<double>(model.d_model) / std::max(c.tp, 1);
    c.memory.temporary += embedding;
  }
}

}  // namespace

RunEstimate estimate_run(const nlohmann::json& run, const HardwareSpec& host,
                         const std::string& run_file) {
  const int world = required<int>(run, "world_size", run_file);
  const json jm = required<json>(run, "model", run_file);
  ModelConfig mc;
  const std::string family = required<std::string>(jm, "family", run_file);
  mc.family = family == "llama"  ? ModelFamily::kLlama
              : family == "bert" ? ModelFamily::kBert
                                 : ModelFamily::kGpt2;
  mc.type_vocab_size = field<int64_t>(jm, "type_vocab_size", family == "bert" ? 2 : 0);
  mc.name = field<std::string>(jm, "name", "custom");
  mc.vocab_size = required<int64_t>(jm, "vocab_size", run_file);
  mc.context_length = required<int64_t>(jm, "context_length", run_file);
  mc.d_model = required<int64_t>(jm, "d_model", run_file);
  mc.n_layers = required<int64_t>(jm, "n_layers", run_file);
  mc.n_heads = required<int64_t>(jm, "n_heads", run_file);
  mc.n_kv_heads = required<int64_t>(jm, "n_kv_heads", run_file);
  mc.ffn_hidden = required<int64_t>(jm, "ffn_hidden", run_file);
  mc.tie_embeddings = required<bool>(jm, "tie_embeddings", run_file);
  mc.dropout = field<double>(jm, "dropout", 0.0);
  mc.n_experts = field<int64_t>(jm, "n_experts", 0);
  mc.experts_per_token = field<int64_t>(jm, "experts_per_token", 0);
  mc.n_shared_experts = field<int64_t>(jm, "n_shared_experts", 0);
  const json train = required<json>(run, "train", run_file);
  const json precision = field<json>(run, "precision", json::object());

  const json parallel = required<json>(run, "parallel", run_file);
  Candidate shape = candidate_of(parallel, world, run_file);
  const int pp = parallel.value("pp", 1);
  if (pp > 1) {
    // Under a pipeline FSDP holds its stage whole through the step beside its shards: at most
    // DDP's model states for the stage (docs/pp.md), estimated as those. A stage holds
    // n_layers / pp blocks; an uneven split is estimated as the whole model, which over-counts.
    if (shape.strategy != PlanStrategy::kZero1) shape.strategy = PlanStrategy::kDdp;
    const std::vector<int64_t> split = parallel.value("pp_split", std::vector<int64_t>());
    const bool even = split.empty() ? mc.n_layers % pp == 0
                                    : std::adjacent_find(split.begin(), split.end(),
                                                         std::not_equal_to<>()) == split.end();
    if (even) shape.pp = pp;
  }
  // A CPU host has no device memory to offload from: "cpu" offload leaves the state where it
  // is, and only what goes to files ("nvme") leaves memory.
  const json zero = parallel.value("zero", json::object());
  const bool optimizer_in_files = zero.value("offload_optimizer", std::string("none")) == "nvme";
  const bool params_in_files = zero.value("offload_param", std::string("none")) == "nvme";
  const double parameters = static_cast<double>(mc.num_parameters());
  auto to_files = [parameters](Candidate& c, bool optimizer, bool params) {
    if (optimizer) c.memory.optimizer = 0;
    if (params) c.memory.params = std::max(0.0, c.memory.params - 4.0 * parameters / c.shard);
  };
  const bool autocast = precision.value("autocast", std::string("none")) == "bf16";
  const bool bf16_params = precision.value("param_dtype", std::string("fp32")) == "bf16";
  WorkloadOptions w;
  w.seq_len(required<int64_t>(train, "seq_len", run_file))
      .micro_batch(required<int64_t>(train, "micro_batch", run_file))
      .activation_checkpointing(field<bool>(train, "activation_checkpointing", false))
      // The blockwise kernel keeps no [seq x seq] scores; LibTorch 1.13's fused kernel on the CPU
      // and the reference keep them, as every run recorded before the choice existed did.
      .fused_attention(field<std::string>(train, "attention", "fused") == "blockwise")
      // Runs recorded before the chunked loss took their loss over the whole logits.
      .chunked_loss(field<bool>(train, "chunked_loss", false))
      // shardtrain keeps fp32 parameters (the master weights) and computes in the autocast dtype.
      .precision(bf16_params || autocast ? "bf16-autocast" : "fp32")
      .safety_margin(0.0);
  w.global_batch(w.micro_batch_ * required<int64_t>(train, "grad_accum", run_file) * world /
                 (shape.tp * shape.pp * shape.cp));
  const json lora = field<json>(run, "lora", json::object());
  const int64_t lora_rank = field<int64_t>(lora, "rank", 0);
  if (lora_rank > 0) w.lora(lora_rank, field<std::string>(lora, "base_dtype", "fp32"));

  // One device per rank, with the rank's threads (0: an equal share of the cores).
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int threads = static_cast<int>(field<int64_t>(train, "threads", 0));
  if (threads <= 0) threads = std::max(1, cores / world);
  HardwareSpec hw = host;
  hw.peak_fp32_flops *= threads;
  hw.peak_bf16_flops *= threads;
  ClusterOptions cluster;
  cluster.gpu(hw.name).gpus_per_node(world).nodes(1).intra(hw.default_intra).hardware(hw);
  if (shape.strategy == PlanStrategy::kHybridShard) {
    // Shard groups play the nodes; replicas reach each other over the same local link.
    const int replicas = world / shape.shard;
    cluster.gpus_per_node(shape.shard)
        .nodes(replicas)
        .inter("ethernet")
        .inter_bandwidth(link_spec(hw.default_intra).bandwidth * shape.shard);
  }
  RunEstimate out;
  const PlanModel model = PlanModel::from_config(mc);
  const int64_t prefetch_elements =
      zero.value("prefetch_bucket_size", TrainConfig().parallel.zero.prefetch_bucket_size);
  out.run = evaluate_candidate(shape, model, hw, cluster, w);
  if (!out.run.valid) throw std::invalid_argument("run '" + run_file + "': " + out.run.note);
  to_files(out.run, optimizer_in_files, params_in_files);
  this_engine_on_cpu(out.run, model, w, parallel.value("strategy", std::string()) == "zero",
                     prefetch_elements, mc.tie_embeddings);
  auto add_alternative = [&](Candidate c, bool files) {
    c = evaluate_candidate(c, model, hw, cluster, w);
    if (!c.valid) return;
    to_files(c, files, files);
    this_engine_on_cpu(c, model, w, /*zero_prefetch=*/files, prefetch_elements, mc.tie_embeddings);
    c.offload = files;
    out.alternatives.push_back(c);
  };
  // The data-parallel strategies at the same world size, least sharded first; the last one is
  // ZeRO-3 with parameters and optimizer state in files.
  for (const auto& [strategy, files] : {std::pair{PlanStrategy::kDdp, false},
                                        {PlanStrategy::kZero1, false},
                                        {PlanStrategy::kZero2, false},
                                        {PlanStrategy::kFullShard, false},
                                        {PlanStrategy::kFullShard, true}}) {
    // LoRA's alternatives are its decision tree's: DDP, FSDP shard_grad_op and full_shard.
    if (lora_rank > 0 && (strategy == PlanStrategy::kZero1 || files)) continue;
    // Under a pipeline: the same stages, with what combines with them (ddp, ZeRO-1).
    if (pp > 1 && strategy != PlanStrategy::kDdp && strategy != PlanStrategy::kZero1) continue;
    Candidate c;
    c.strategy = strategy;
    c.cp = shape.cp;
    c.ep = shape.ep;
    if (pp > 1) {
      c.tp = shape.tp;
      c.pp = shape.pp;
    }
    add_alternative(c, files);
  }
  // Then context parallelism, which divides the activations: for a long sequence, what fits
  // when no sharding of the model's state does.
  for (int cp = 2 * shape.cp; pp == 1 && lora_rank == 0 && cp <= world; cp *= 2) {
    for (PlanStrategy strategy : {PlanStrategy::kDdp, PlanStrategy::kFullShard}) {
      Candidate c;
      c.strategy = strategy;
      c.cp = cp;
      add_alternative(c, false);
    }
  }
  return out;
}

std::string config_setting(const Candidate& c) {
  if (c.cp > 1) {
    Candidate without = c;
    without.cp = 1;
    return config_setting(without) + ", and parallel.cp = " + std::to_string(c.cp);
  }
  if (c.lora && c.strategy == PlanStrategy::kZero2) {
    return "parallel.strategy = \"fsdp\" with parallel.fsdp.sharding = \"shard_grad_op\"";
  }
  if (c.lora && c.strategy == PlanStrategy::kFullShard) {
    return "parallel.strategy = \"fsdp\" (full_shard)";
  }
  switch (c.strategy) {
    case PlanStrategy::kDdp:
      return "parallel.strategy = \"ddp\"";
    case PlanStrategy::kZero1:
      return "parallel.strategy = \"zero\" with parallel.zero.stage = 1";
    case PlanStrategy::kZero2:
      return "parallel.strategy = \"zero\" with parallel.zero.stage = 2";
    default:
      return c.offload ? "parallel.strategy = \"zero\" with parallel.zero.stage = 3 and "
                         "offload_optimizer = offload_param = \"nvme\""
                       : "parallel.strategy = \"fsdp\" (full_shard), or \"zero\" with stage 3";
  }
}

}  // namespace detail

ValidationResult validate_run(const std::string& run_dir, const HardwareSpec& host) {
  const auto dir = std::filesystem::path(run_dir);
  const std::string run_file = (dir / "run.json").string();
  const json run = read_json(run_file);
  const int world = required<int>(run, "world_size", run_file);
  const Candidate est = detail::estimate_run(run, host, run_file).run;
  const std::string metrics_file = (dir / "metrics.jsonl").string();
  std::ifstream in(metrics_file);
  if (!in) throw std::invalid_argument("cannot read '" + metrics_file + "'");
  std::map<int64_t, double> step_time;  // slowest rank per step
  std::map<int64_t, std::vector<double>> states;
  double peak_rss = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const json j = json::parse(line, nullptr, false);
    if (j.is_discarded()) throw std::invalid_argument("'" + metrics_file + "': a line is not JSON");
    const int64_t step = required<int64_t>(j, "step", metrics_file);
    const json mem = required<json>(j, "mem", metrics_file);
    step_time[step] = std::max(step_time[step], required<double>(j, "step_time_s", metrics_file));
    peak_rss = std::max(peak_rss, field<double>(mem, "peak_rss", 0.0));
    states[step].push_back(required<double>(mem, "params", metrics_file) +
                           required<double>(mem, "grads", metrics_file) +
                           required<double>(mem, "optim", metrics_file));
  }
  if (step_time.empty()) throw std::invalid_argument("'" + metrics_file + "' has no steps");
  // The first step allocates gradients and optimizer state and warms caches: left out when
  // there are others.
  if (step_time.size() > 1) {
    step_time.erase(step_time.begin());
    states.erase(states.begin());
  }
  std::vector<double> times, bytes;
  for (const auto& [step, t] : step_time) times.push_back(t);
  for (const auto& [step, per_rank] : states)
    bytes.insert(bytes.end(), per_rank.begin(), per_rank.end());

  ValidationResult r;
  r.strategy = est.label();
  r.world_size = world;
  r.steps = static_cast<int64_t>(times.size());
  r.estimated_model_states = est.memory.model_states();
  r.measured_model_states = detail::median(bytes);
  r.estimated_step_time = est.time.total;
  r.measured_step_time = detail::median(times);
  r.estimated_peak = est.memory.total() +
                     field<json>(run, "process", json::object()).value("resident_at_start", 0.0);
  r.measured_peak_rss = peak_rss;
  return r;
}

std::string format_validation(const ValidationResult& r) {
  std::string out =
      detail::format("run: %s on %d rank(s), %lld steps measured\n", r.strategy.c_str(),
                     r.world_size, static_cast<long long>(r.steps));
  out += detail::format(
      "model states per rank: estimate %.0f bytes, measured %.0f bytes, error %+.1f%%\n",
      r.estimated_model_states, r.measured_model_states, 100 * r.model_state_error());
  out += detail::format("step time: estimate %.4f s, measured %.4f s (median), error %+.1f%%\n",
                        r.estimated_step_time, r.measured_step_time, 100 * r.step_time_error());
  if (r.measured_peak_rss > 0) {
    out += detail::format(
        "peak memory per rank: estimate %.0f bytes, measured peak RSS %.0f bytes (largest rank), "
        "error %+.1f%%\n",
        r.estimated_peak, r.measured_peak_rss, 100 * r.peak_error());
  }
  return out;
}

}  // namespace shardtrain
