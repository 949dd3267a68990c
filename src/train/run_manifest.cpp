#include "train/run_manifest.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "common/file_error.h"
#include "parallel/parallelize.h"

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
                  {"n_experts", m.n_experts},
                  {"experts_per_token", m.experts_per_token},
                  {"n_shared_experts", m.n_shared_experts},
                  {"num_parameters", m.num_parameters()}};
  if (m.type_vocab_size > 0) run["model"]["type_vocab_size"] = m.type_vocab_size;
  if (m.moe()) run["model"]["active_parameters"] = m.active_parameters();
  run["train"] = {{"micro_batch", config.train.micro_batch},
                  {"grad_accum", config.train.grad_accum},
                  {"seq_len", config.data.seq_len},
                  {"activation_checkpointing", config.train.activation_checkpointing},
                  {"chunked_loss", config.train.chunked_loss},
                  {"attention", attention_kernel_name(config)},
                  {"threads", config.run.threads},
                  {"device", config.run.device},
                  {"steps", config.train.steps},
                  {"lr", config.train.lr},
                  {"schedule", config.train.schedule},
                  {"warmup", config.train.warmup},
                  {"warmup_type", config.train.warmup_type},
                  {"min_lr", config.train.min_lr},
                  {"clip", config.train.clip},
                  {"eval_every", config.train.eval_every}};
  run["parallel"] = {{"strategy", to_string(config.parallel.strategy)},
                     {"tp", config.parallel.tp},
                     {"sequence_parallel", config.parallel.sequence_parallel},
                     {"pp", config.parallel.pp},
                     {"cp", config.parallel.cp},
                     {"ep", config.parallel.ep},
                     {"pp_schedule", to_string(config.parallel.pp_schedule)},
                     {"pp_split", config.parallel.pp_split},
                     {"ddp",
                      {{"bucket_cap_mb", config.parallel.ddp.bucket_cap_mb},
                       {"find_unused_parameters", config.parallel.ddp.find_unused_parameters},
                       {"comm_hook", to_string(config.parallel.ddp.comm_hook)}}},
                     {"fsdp",
                      {{"sharding", to_string(config.parallel.fsdp.sharding)},
                       {"replicate", config.parallel.fsdp.replicate},
                       {"wrap", to_string(config.parallel.fsdp.wrap)},
                       {"prefetch", to_string(config.parallel.fsdp.prefetch)},
                       {"limit_all_gathers", config.parallel.fsdp.limit_all_gathers},
                       {"cpu_offload", config.parallel.fsdp.cpu_offload}}},
                     {"zero",
                      {{"stage", config.parallel.zero.stage},
                       {"offload_optimizer", to_string(config.parallel.zero.offload_optimizer)},
                       {"offload_param", to_string(config.parallel.zero.offload_param)},
                       {"prefetch_bucket_size", config.parallel.zero.prefetch_bucket_size}}}};
  // Masters stay fp32; param_dtype is the dtype FSDP/ZeRO gather and compute in, autocast the
  // compute dtype otherwise.
  run["precision"] = {{"param_dtype", config.precision.param_dtype},
                      {"reduce_dtype", config.precision.reduce_dtype},
                      {"autocast", config.precision.autocast},
                      {"loss_scale", config.precision.loss_scale},
                      {"hysteresis", config.precision.hysteresis}};
  if (config.run.trace) {
    const int64_t last = config.run.trace_last ? config.run.trace_last : config.train.steps;
    run["trace"] = {{"steps", {config.run.trace_first, last}}};
  }
  if (config.lora.rank > 0) {
    run["lora"] = {{"rank", config.lora.rank}, {"base_dtype", config.lora.base_dtype}};
  }
  if (config.compression.enabled()) {
    const CompressionSection& q = config.compression;
    run["compression"] = {{"weight_bits", q.weight_bits},
                          {"weight_modules", q.weight_modules},
                          {"weight_groups", q.weight_groups},
                          {"weight_type", q.weight_type},
                          {"weight_offset", q.weight_offset},
                          {"activation_bits", q.activation_bits},
                          {"activation_modules", q.activation_modules},
                          {"activation_type", q.activation_type},
                          {"activation_offset", q.activation_offset}};
  }
  return run;
}

void write_run_manifest(const TrainConfig& config, int world_size, int64_t resident_at_start) {
  nlohmann::ordered_json run = run_manifest(config, world_size);
  run["process"] = {{"resident_at_start", resident_at_start}};
  const std::filesystem::path path = std::filesystem::path(config.run.dir) / "run.json";
  replace_file(path.string(), run.dump(2) + "\n");
}

}  // namespace shardtrain::detail
