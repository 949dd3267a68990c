#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "commands.h"
#include "shardtrain/plan.h"

namespace shardtrain::cli {
namespace {

struct PlanArgs {
  std::string model, validate, chart, out_dir;
  double params = 0;
  int64_t layers = 0, d_model = 0, heads = 0, kv_heads = 0, ffn = 0, vocab = 32000;
  bool gated = false, force = false;
  std::string gpu = "h100-80gb", intra, inter = "ib", precision = "bf16", optimizer = "adamw";
  int64_t lora = 0;
  std::string lora_base = "bf16";
  int gpus = 8, nodes = 1, threads = 1;
  double inter_gbps = 0, host_mem_gb = 0, efficiency = 0, margin = 0.1;
  int64_t seq_len = 2048, micro_batch = 1, global_batch = 0;
  bool checkpointing = false, unfused_attention = false, json = false, measure_host = false;
  bool fp32_grads = false, selective = false, tp_overlap = false;
  int virtual_stages = 1;
  bool list_gpus = false;
};

PlanModel plan_model(const PlanArgs& a) {
  if (!a.model.empty() && a.params > 0) {
    throw std::invalid_argument("give either --model or --params with layer shapes, not both");
  }
  // 0 is "not given"; anything else must be a count the shapes below can hold.
  if (a.params != 0 && !(a.params >= 1 && a.params <= 1e15)) {
    std::ostringstream got;
    got << a.params;
    throw std::invalid_argument("--params must be a parameter count between 1 and 1e15, got " +
                                got.str());
  }
  if (a.params > 0) {
    if (a.layers <= 0 || a.d_model <= 0 || a.heads <= 0) {
      throw std::invalid_argument("--params needs --layers, --d-model and --heads");
    }
    return PlanModel::from_shapes(static_cast<int64_t>(a.params), a.layers, a.d_model, a.heads,
                                  a.kv_heads, a.ffn, a.vocab, a.gated);
  }
  if (a.model.empty()) {
    throw std::invalid_argument(
        "plan needs --model PRESET|config.json, --params with layer "
        "shapes, or --validate RUN_DIR");
  }
  if (std::filesystem::path(a.model).extension() == ".json") {
    PlanModel m = PlanModel::from_config(model_config_from_hf_json(a.model));
    m.name = a.model;
    m.hf_config = a.model;
    return m;
  }
  return PlanModel::from_config(model_preset(a.model));
}

void write_file(const std::filesystem::path& path, const std::string& text) {
  errno = 0;
  std::ofstream out(path);
  out << text;
  out.close();
  if (!out) {
    throw std::invalid_argument("cannot write '" + path.string() +
                                "': " + std::strerror(errno ? errno : EIO));
  }
}

// The configs --out writes. Files already there (perhaps edited by hand) are replaced only with
// --force; without it the run stops before printing anything.
const char* const kConfigFiles[] = {"shardtrain.toml", "ds_config.json", "accelerate.yaml"};
void check_out_dir(const PlanArgs& a) {
  if (a.out_dir.empty() || a.force) return;
  std::string there;
  for (const char* name : kConfigFiles) {
    const std::filesystem::path file = std::filesystem::path(a.out_dir) / name;
    std::error_code error;
    if (std::filesystem::exists(file, error))
      there += (there.empty() ? "'" : ", '") + file.string() + "'";
  }
  if (!there.empty()) {
    throw std::invalid_argument("--out: " + there +
                                " already exist(s); pass --force to replace them, or choose "
                                "another directory");
  }
}

void run_plan(const PlanArgs& a) {
  if (a.list_gpus) {
    for (const auto& h : hardware_table()) {
      std::printf("%-11s %6.0f GB  bf16 %7.1f TFLOP/s  fp32 %6.1f TFLOP/s  %6.0f GB/s  (%s)\n",
                  h.name.c_str(), h.memory_bytes / 1e9, h.peak_bf16_flops / 1e12,
                  h.peak_fp32_flops / 1e12, h.memory_bw / 1e9, h.source.c_str());
    }
    return;
  }
  if (!a.validate.empty()) {
    // With --measure-host the estimate uses this host as measured now, not the table's entry.
    const HardwareSpec host = a.measure_host ? measure_cpu_host(1) : hardware_spec("cpu");
    std::cout << format_validation(validate_run(a.validate, host));
    return;
  }
  if (a.measure_host) {
    const HardwareSpec h = measure_cpu_host(a.threads);
    std::printf(
        "cpu host, %d thread(s): fp32 GEMM %.1f GFLOP/s, bf16 GEMM %.1f GFLOP/s, copy "
        "bandwidth %.1f GB/s, memory per device %.1f GB\n",
        a.threads, h.peak_fp32_flops / 1e9, h.peak_bf16_flops / 1e9, h.memory_bw / 1e9,
        h.memory_bytes / 1e9);
    return;
  }
  check_out_dir(a);
  ClusterOptions cluster;
  cluster.gpu(a.gpu)
      .gpus_per_node(a.gpus)
      .nodes(a.nodes)
      .intra(a.intra)
      .inter(a.inter)
      .inter_bandwidth(a.inter_gbps * 1e9 / 8)
      .host_memory(a.host_mem_gb * 1e9);
  WorkloadOptions workload;
  workload.seq_len(a.seq_len)
      .micro_batch(a.micro_batch)
      .global_batch(a.global_batch)
      .precision(a.precision)
      .optimizer(a.optimizer)
      .fp32_grads(a.fp32_grads)
      .activation_checkpointing(a.checkpointing)
      .selective_checkpointing(a.selective)
      .virtual_stages(a.virtual_stages)
      .tp_overlap(a.tp_overlap)
      .fused_attention(!a.unfused_attention)
      .efficiency(a.efficiency)
      .safety_margin(a.margin)
      .lora(a.lora, a.lora_base);
  const Plan plan = make_plan(plan_model(a), cluster, workload);
  std::cout << (a.json ? plan_to_json(plan) : format_plan(plan));
  if (!a.chart.empty()) write_file(a.chart, memory_chart_svg(plan));
  if (!a.out_dir.empty()) {
    const Candidate* rec = plan.recommendation();
    if (!rec) throw std::invalid_argument("--out: nothing fits, so there is no config to write");
    std::filesystem::create_directories(a.out_dir);
    const std::filesystem::path dir(a.out_dir);
    write_file(dir / kConfigFiles[0], shardtrain_toml(plan, *rec));
    write_file(dir / kConfigFiles[1], deepspeed_json(plan, *rec));
    write_file(dir / kConfigFiles[2], accelerate_yaml(plan, *rec));
  }
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "plan",
      "Estimate per-device memory and step time of DDP, ZeRO-1/2/3, FSDP, TP x PP x DP, for "
      "long sequences FSDP x CP and for mixture-of-experts models x EP on a cluster, recommend "
      "one, and write its configs (docs/planner.md)");
  auto a = std::make_shared<PlanArgs>();
  cmd->add_option("--model", a->model, "a preset name, or a Hugging Face config.json");
  cmd->add_option("--params", a->params,
                  "a bare parameter count (e.g. 7e9), with the shapes below");
  cmd->add_option("--layers", a->layers, "transformer blocks (with --params)");
  cmd->add_option("--d-model", a->d_model, "hidden size (with --params)");
  cmd->add_option("--heads", a->heads, "attention heads (with --params)");
  cmd->add_option("--kv-heads", a->kv_heads, "key/value heads (default: --heads)");
  cmd->add_option("--ffn", a->ffn, "MLP inner size (default: 4 x d-model)");
  cmd->add_option("--vocab", a->vocab, "vocabulary size (default 32000)");
  cmd->add_flag("--gated-mlp", a->gated, "SwiGLU MLP (Llama-style) rather than GELU");
  cmd->add_option("--gpu", a->gpu, "device kind (--list-gpus)")->capture_default_str();
  cmd->add_option("--gpus", a->gpus, "devices per node")->capture_default_str();
  cmd->add_option("--nodes", a->nodes, "nodes")->capture_default_str();
  cmd->add_option("--intra", a->intra,
                  "intra-node link: nvlink, pcie3, pcie4, pcie5 (default: "
                  "the device's usual one)");
  cmd->add_option("--inter", a->inter, "inter-node network: ib or ethernet")->capture_default_str();
  cmd->add_option("--inter-gbps", a->inter_gbps,
                  "inter-node bandwidth per node, Gbit/s (default: 400 per GPU for ib, 100 for "
                  "ethernet)");
  cmd->add_option("--host-mem-gb", a->host_mem_gb,
                  "host memory per node, GB (default: the "
                  "device's reference server)");
  cmd->add_option("--seq-len", a->seq_len, "tokens per sequence")->capture_default_str();
  cmd->add_option("--micro-batch", a->micro_batch, "sequences per device per micro-batch")
      ->capture_default_str();
  cmd->add_option("--global-batch", a->global_batch,
                  "sequences per optimizer step (default: micro-batch x devices)");
  cmd->add_option("--precision", a->precision, "bf16 (mixed, fp32 master), fp32, bf16-autocast")
      ->capture_default_str();
  cmd->add_option("--optimizer", a->optimizer, "adamw or sgd")->capture_default_str();
  cmd->add_flag("--fp32-grads", a->fp32_grads,
                "with bf16: gradients accumulated and reduced in fp32 (Megatron's main_grad; "
                "with ZeRO-1 its distributed optimizer)");
  cmd->add_flag("--checkpointing", a->checkpointing, "full activation checkpointing per block");
  cmd->add_flag("--selective-checkpointing", a->selective,
                "selective activation checkpointing (torchtitan's per-operator policy: every "
                "other matmul's output and the attention's kept, the rest recomputed)");
  cmd->add_option("--lora", a->lora,
                  "LoRA fine-tuning with adapters of this rank on every linear layer (the base "
                  "frozen): estimates and recommends DDP, FSDP shard_grad_op or full_shard");
  cmd->add_option("--lora-base", a->lora_base,
                  "the frozen base's dtype with --lora: bf16, fp32 or nf4 (QLoRA)")
      ->capture_default_str();
  cmd->add_option("--virtual-stages", a->virtual_stages,
                  "interleaved pipeline schedule: stages per device (Megatron's virtual pipeline "
                  "size)")
      ->capture_default_str();
  cmd->add_flag("--tp-overlap", a->tp_overlap,
                "tensor-parallel collectives overlapped with the matmuls (Megatron's "
                "--tp-comm-overlap, torchtitan's async TP)");
  cmd->add_flag("--unfused-attention", a->unfused_attention,
                "attention keeps its [seq x seq] scores (no FlashAttention-style kernel)");
  cmd->add_option("--efficiency", a->efficiency,
                  "achieved fraction of peak FLOP/s (default: fitted to published runs per "
                  "device kind and model width, see docs/planner.md)");
  cmd->add_option("--margin", a->margin, "device memory kept free")->capture_default_str();
  cmd->add_flag("--json", a->json, "print everything as JSON");
  cmd->add_option("--chart", a->chart, "write an SVG chart of memory per device by candidate");
  cmd->add_option("--out", a->out_dir,
                  "write shardtrain.toml, ds_config.json and accelerate.yaml "
                  "of the recommendation to this directory (refused when they exist: --force)");
  cmd->add_flag("--force", a->force, "with --out: replace the files already there");
  cmd->add_option("--validate", a->validate, "compare the estimate with a finished shardtrain run");
  cmd->add_flag("--measure-host", a->measure_host,
                "measure this host's GEMM rate and bandwidth (with --validate: estimate with "
                "the figures measured now, one thread per rank)");
  cmd->add_option("--threads", a->threads, "threads for --measure-host")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  cmd->add_flag("--list-gpus", a->list_gpus, "print the hardware table");
  cmd->callback([a] { run_plan(*a); });
}

}  // namespace shardtrain::cli
