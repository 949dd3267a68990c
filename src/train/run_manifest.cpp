#include "train/run_manifest.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace shardtrain::detail {

nlohmann::ordered_json run_manifest(const TrainConfig& config, int world_size) {
  const ModelConfig& m = config.model;
  nlohmann::ordered_json run;
  run["format"] = 1;
  run["world_size"] = world_size;
  run["model"] = {{"name", m.name},
                  {"family", to_string(m.family)},
                  {"vocab_size", m.vocab_size},
                  {"context_length", m.context_length},
                  {"d_model", m.d_model},
                  {"n_layers", m.n_layers},
                  {"n_heads", m.n_heads},
                  {"n_kv_heads", m.n_kv_heads},
                  {"ffn_hidden", m.ffn_hidden},
                  {"dropout", m.dropout},
                  {"tie_embeddings", m.tie_embeddings},
                  {"num_parameters", m.num_parameters()}};
  run["train"] = {{"micro_batch", config.micro_batch},
                  {"grad_accum", config.grad_accum},
                  {"seq_len", config.seq_len},
                  {"activation_checkpointing", config.activation_checkpointing},
                  {"threads", config.threads},
                  {"steps", config.steps},
                  {"lr", config.lr},
                  {"eval_every", config.eval_every}};
  run["parallel"] = {{"strategy", config.strategy},
                     {"tp", config.tp},
                     {"sequence_parallel", config.sequence_parallel},
                     {"pp", config.pp},
                     {"pp_schedule", config.pp_schedule},
                     {"pp_split", config.pp_split},
                     {"ddp",
                      {{"bucket_cap_mb", config.ddp_bucket_cap_mb},
                       {"find_unused_parameters", config.ddp_find_unused_parameters},
                       {"comm_hook", config.ddp_comm_hook}}},
                     {"fsdp",
                      {{"sharding", config.fsdp_sharding},
                       {"replicate", config.fsdp_replicate},
                       {"wrap", config.fsdp_wrap},
                       {"prefetch", config.fsdp_prefetch},
                       {"limit_all_gathers", config.fsdp_limit_all_gathers},
                       {"cpu_offload", config.fsdp_cpu_offload}}},
                     {"zero",
                      {{"stage", config.zero_stage},
                       {"offload_optimizer", config.zero_offload_optimizer},
                       {"offload_param", config.zero_offload_param},
                       {"prefetch_bucket_size", config.zero_prefetch_bucket_size}}}};
  // Masters stay fp32; param_dtype is the dtype FSDP/ZeRO gather and compute in, autocast the
  // compute dtype otherwise.
  run["precision"] = {{"param_dtype", config.param_dtype},
                      {"reduce_dtype", config.reduce_dtype},
                      {"autocast", config.autocast},
                      {"loss_scale", config.loss_scale}};
  if (config.trace) {
    const int64_t last = config.trace_last ? config.trace_last : config.steps;
    run["trace"] = {{"steps", {config.trace_first, last}}};
  }
  if (config.lora_rank > 0) {
    run["lora"] = {{"rank", config.lora_rank}, {"base_dtype", config.lora_base_dtype}};
  }
  return run;
}

void write_run_manifest(const TrainConfig& config, int world_size, int64_t resident_at_start) {
  nlohmann::ordered_json run = run_manifest(config, world_size);
  run["process"] = {{"resident_at_start", resident_at_start}};
  const std::filesystem::path path = std::filesystem::path(config.dir) / "run.json";
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp);
    out << run.dump(2) << "\n";
    if (!out) throw std::runtime_error("cannot write '" + tmp.string() + "'");
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace shardtrain::detail
