// The accelerate config importer: the FSDP example, accelerate's spellings, and clear errors.
#include <gtest/gtest.h>

#include <algorithm>

#include "shardtrain/config.h"

namespace shardtrain {
namespace accelerate_config_test {

const std::string kConfigs = std::string(SHARDTRAIN_SOURCE_DIR) + "/configs/";

std::string error_of(const std::string& yaml, int world_size = 2) {
  try {
    accelerate_overrides_from_yaml(yaml, "acc.yaml", world_size);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TrainConfig resolve(const std::string& yaml, int world_size = 2) {
  return load_train_config(kConfigs + "zero_tiny.toml",
                           accelerate_overrides_from_yaml(yaml, "acc.yaml", world_size));
}

TEST(AccelerateConfigTest, FsdpExampleGivesItsOverrides) {
  const auto got = accelerate_overrides(kConfigs + "accelerate_fsdp.yaml", 2);
  EXPECT_EQ(got, (std::vector<std::string>{
                     "parallel.strategy=\"fsdp\"", "train.activation_checkpointing=false",
                     "parallel.fsdp.prefetch=\"backward_pre\"",
                     "parallel.fsdp.forward_prefetch=false", "parallel.fsdp.cpu_offload=false",
                     "parallel.fsdp.sharding=\"full_shard\"", "parallel.fsdp.wrap=\"class\"",
                     "parallel.fsdp.wrap_classes=[\"GPT2Block\"]", "precision.param_dtype=\"bf16\"",
                     "precision.reduce_dtype=\"bf16\"", "precision.buffer_dtype=\"bf16\""}));
  const TrainConfig config = load_train_config(kConfigs + "zero_tiny.toml", got);
  EXPECT_EQ(config.parallel.strategy, ParallelStrategy::kFsdp);
  EXPECT_EQ(config.parallel.fsdp.wrap_classes, (std::vector<std::string>{"GPT2Block"}));
  EXPECT_EQ(config.precision.param_dtype, "bf16");
}

const char* kBase = "distributed_type: FSDP\nnum_processes: 2\n";

TEST(AccelerateConfigTest, ShardingByNameOrNumberAndWrapPolicies) {
  const std::pair<const char*, const char*> cases[] = {{"1", "full_shard"},
                                                       {"2", "shard_grad_op"},
                                                       {"3", "no_shard"},
                                                       {"4", "hybrid_shard"},
                                                       {"SHARD_GRAD_OP", "shard_grad_op"},
                                                       {"HYBRID_SHARD", "hybrid_shard"}};
  for (const auto& [given, want] : cases) {
    EXPECT_EQ(
        resolve(std::string(kBase) + "fsdp_config:\n  fsdp_sharding_strategy: " + given + "\n")
            .parallel.fsdp.sharding,
        sharding_strategy_from_string(want))
        << given;
  }
  auto c = resolve(std::string(kBase) +
                   "fsdp_config:\n  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n"
                   "  fsdp_min_num_params: 1000\n");
  EXPECT_EQ(c.parallel.fsdp.wrap, FsdpWrap::kSize);
  EXPECT_EQ(c.parallel.fsdp.min_params, 1000);
  c = resolve(std::string(kBase) +
              "fsdp_config:\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
              "  fsdp_transformer_layer_cls_to_wrap: GPT2Block, LlamaDecoderLayer\n"
              "  fsdp_backward_prefetch: NO_PREFETCH\n  fsdp_offload_params: true\n");
  EXPECT_EQ(c.parallel.fsdp.wrap_classes,
            (std::vector<std::string>{"GPT2Block", "LlamaDecoderLayer"}));
  EXPECT_EQ(c.parallel.fsdp.prefetch, BackwardPrefetch::kNone);
  EXPECT_TRUE(c.parallel.fsdp.cpu_offload);
  c = resolve(std::string(kBase) + "mixed_precision: fp16\n");
  EXPECT_EQ(c.precision.autocast, "fp16");
  EXPECT_EQ(c.precision.loss_scale, "dynamic");
  c = resolve(std::string(kBase) + "mixed_precision: 'no'\n");
  EXPECT_EQ(c.precision.param_dtype, "fp32");
  EXPECT_EQ(c.precision.autocast, "none");
}

TEST(AccelerateConfigTest, UnknownKeysAreNamed) {
  auto e = error_of(std::string(kBase) + "fsdp_config:\n  fsdp_foo: 1\n");
  EXPECT_NE(e.find("'fsdp_config.fsdp_foo'"), std::string::npos) << e;
  EXPECT_NE(e.find("acc.yaml"), std::string::npos) << e;
  e = error_of(std::string(kBase) + "megatron_config: {}\n");
  EXPECT_NE(e.find("'megatron_config'"), std::string::npos) << e;
}

TEST(AccelerateConfigTest, UnsupportedValuesNameKeyAndValue) {
  auto e = error_of(std::string(kBase) + "fsdp_config:\n  fsdp_sharding_strategy: 5\n");
  EXPECT_NE(e.find("'fsdp_config.fsdp_sharding_strategy' = '5'"), std::string::npos) << e;
  e = error_of(std::string(kBase) + "fsdp_config:\n  fsdp_sharding_strategy: HYBRID_SHARD_ZERO2\n");
  EXPECT_NE(e.find("HYBRID_SHARD_ZERO2"), std::string::npos) << e;
  e = error_of(std::string(kBase) + "fsdp_config:\n  fsdp_auto_wrap_policy: NO_WRAP\n");
  EXPECT_NE(e.find("'fsdp_config.fsdp_auto_wrap_policy' = 'NO_WRAP'"), std::string::npos) << e;
  e = error_of(std::string(kBase) + "fsdp_config:\n  fsdp_state_dict_type: LOCAL_STATE_DICT\n");
  EXPECT_NE(e.find("'fsdp_config.fsdp_state_dict_type' = 'LOCAL_STATE_DICT'"), std::string::npos)
      << e;
  e = error_of("distributed_type: MEGATRON_LM\nnum_processes: 2\n");
  EXPECT_NE(e.find("'distributed_type' = 'MEGATRON_LM'"), std::string::npos) << e;
  e = error_of("distributed_type: DEEPSPEED\nnum_processes: 2\n");
  EXPECT_NE(e.find("no 'deepspeed_config'"), std::string::npos) << e;
  e = error_of(
      "distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n  zero_stage: 4\n");
  EXPECT_NE(e.find("'deepspeed_config.zero_stage' = '4'"), std::string::npos) << e;
}

TEST(AccelerateConfigTest, Fp8IsTransformerEnginesDelayedScalingUnderBf16Autocast) {
  // accelerate's defaults without fp8_config: HYBRID, a history of 1024, most_recent.
  TrainConfig c = resolve(std::string(kBase) + "mixed_precision: fp8\n");
  EXPECT_EQ(c.precision.fp8, "hybrid");
  EXPECT_EQ(c.precision.autocast, "bf16");
  EXPECT_EQ(c.precision.fp8_amax_history, 1024);
  EXPECT_EQ(c.precision.fp8_amax_algo, "most_recent");
  EXPECT_EQ(c.precision.fp8_margin, 0);
  c = resolve(std::string(kBase) +
              "mixed_precision: fp8\nfp8_config:\n  backend: TE\n  fp8_format: E4M3\n"
              "  amax_history_len: 16\n  amax_compute_algo: max\n  margin: 2\n  interval: 1\n"
              "  override_linear_precision: (false, false, false)\n"
              "  use_autocast_during_eval: false\n");
  EXPECT_EQ(c.precision.fp8, "e4m3");
  EXPECT_EQ(c.precision.fp8_amax_history, 16);
  EXPECT_EQ(c.precision.fp8_amax_algo, "max");
  EXPECT_EQ(c.precision.fp8_margin, 2);
  // `accelerate config` writes the longer key names, and the values in other cases.
  c = resolve(std::string(kBase) +
              "mixed_precision: fp8\nfp8_config:\n  fp8_format: e4m3\n"
              "  amax_history_length: 32\n  amax_compute_algorithm: MAX\n");
  EXPECT_EQ(c.precision.fp8, "e4m3");
  EXPECT_EQ(c.precision.fp8_amax_history, 32);
  EXPECT_EQ(c.precision.fp8_amax_algo, "max");
  // fp8_config without mixed_precision fp8 is ignored, as accelerate ignores it.
  EXPECT_EQ(resolve(std::string(kBase) + "fp8_config:\n  fp8_format: E4M3\n").precision.fp8,
            "none");
  const std::string fp8 = std::string(kBase) + "mixed_precision: fp8\nfp8_config:\n";
  auto e = error_of(fp8 + "  backend: MSAMP\n");
  EXPECT_NE(e.find("'fp8_config.backend' = 'MSAMP'"), std::string::npos) << e;
  e = error_of(fp8 + "  override_linear_precision: [true, false, false]\n");
  EXPECT_NE(e.find("'fp8_config.override_linear_precision'"), std::string::npos) << e;
  e = error_of(fp8 + "  use_autocast_during_eval: true\n");
  EXPECT_NE(e.find("'fp8_config.use_autocast_during_eval'"), std::string::npos) << e;
  e = error_of(fp8 + "  interval: 16\n");
  EXPECT_NE(e.find("'fp8_config.interval' = '16'"), std::string::npos) << e;
  e = error_of(fp8 + "  fp8_format: E5M2\n");
  EXPECT_NE(e.find("'fp8_config.fp8_format' = 'E5M2'"), std::string::npos) << e;
  e = error_of(fp8 + "  amax_compute_algo: mean\n");
  EXPECT_EQ(e, "");  // a value the config check refuses, naming the key
  try {
    resolve(fp8 + "  amax_compute_algo: mean\n");
    ADD_FAILURE() << "amax_compute_algo mean accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("precision.fp8_amax_algo"), std::string::npos)
        << error.what();
  }
}

TEST(AccelerateConfigTest, NumProcessesMustMatchTheLaunchedWorld) {
  const auto e = error_of("distributed_type: FSDP\nnum_processes: 8\n", 2);
  EXPECT_NE(e.find("'num_processes' = '8'"), std::string::npos) << e;
  EXPECT_NE(e.find("2 rank(s)"), std::string::npos) << e;
  EXPECT_EQ(error_of("distributed_type: FSDP\nnum_processes: 2\n", 2), "");
}

TEST(AccelerateConfigTest, Fsdp2FilesAndTheModelsOwnBlocks) {
  // FSDP2's spelling: fsdp_version 2 and reshard_after_forward in place of the strategy; a
  // transformer wrap without classes takes the model's own blocks, as accelerate does.
  std::vector<ImportNote> notes;
  const std::string fsdp2 = std::string(kBase) +
                            "fsdp_config:\n  fsdp_version: 2\n"
                            "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n";
  auto got = accelerate_overrides_from_yaml(fsdp2 + "  fsdp_reshard_after_forward: false\n",
                                            "acc.yaml", 2, &notes);
  auto c = load_train_config(kConfigs + "zero_tiny.toml", got);
  EXPECT_EQ(c.parallel.fsdp.sharding, ShardingStrategy::kShardGradOp);
  EXPECT_EQ(c.parallel.fsdp.wrap, FsdpWrap::kBlock);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0].file_key, "fsdp_config.fsdp_transformer_layer_cls_to_wrap");
  c = resolve(fsdp2 + "  fsdp_reshard_after_forward: true\n");
  EXPECT_EQ(c.parallel.fsdp.sharding, ShardingStrategy::kFullShard);
  c = resolve(fsdp2 + "  fsdp_reshard_after_forward: FULL_SHARD\n");
  EXPECT_EQ(c.parallel.fsdp.sharding, ShardingStrategy::kFullShard);
  // accelerate's ND sizes: tensor parallelism inside, replicas of the shards across.
  c = resolve(
      "distributed_type: FSDP\nnum_processes: 8\nfsdp_config:\n  fsdp_version: 2\n"
      "parallelism_config:\n  parallelism_config_dp_replicate_size: 2\n"
      "  parallelism_config_dp_shard_size: 2\n  parallelism_config_tp_size: 2\n"
      "  parallelism_config_cp_size: 1\n",
      8);
  EXPECT_EQ(c.parallel.tp, 2);
  EXPECT_EQ(c.parallel.fsdp.sharding, ShardingStrategy::kHybridShard);
  EXPECT_EQ(c.parallel.fsdp.replicate, 2);
  const auto e = error_of(fsdp2 + "parallelism_config:\n  parallelism_config_tp_size: 3\n", 2);
  EXPECT_NE(e.find("do not make the launch's 2 rank(s)"), std::string::npos) << e;
}

TEST(AccelerateConfigTest, OneProcessAndOtherDevicesDataParallel) {
  auto c = resolve("distributed_type: 'NO'\nnum_processes: 1\nmixed_precision: bf16\n", 1);
  EXPECT_EQ(c.parallel.strategy, ParallelStrategy::kNone);
  EXPECT_EQ(c.precision.autocast, "bf16");
  EXPECT_NE(error_of("distributed_type: 'NO'\n", 2).find("runs one process"), std::string::npos);
  // The empty sections `accelerate config` writes for the other types.
  c = resolve(
      "distributed_type: MULTI_XPU\nnum_processes: 2\nfsdp_config: {}\n"
      "deepspeed_config: {}\nmegatron_lm_config: {}\n");
  EXPECT_EQ(c.parallel.strategy, ParallelStrategy::kDdp);
  // A section for another type is ignored, as accelerate ignores it, and said so.
  std::vector<ImportNote> notes;
  accelerate_overrides_from_yaml(
      "distributed_type: MULTI_GPU\nnum_processes: 2\nfsdp_config:\n  fsdp_version: 1\n",
      "acc.yaml", 2, &notes);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0].file_key, "fsdp_config");
}

TEST(AccelerateConfigTest, DeepSpeedBlockMeansWhatTheDeepSpeedFileWould) {
  // bf16 through accelerate's DeepSpeed block is DeepSpeed's bf16 (bf16 weights), as through
  // --deepspeed; no zero_stage is accelerate's default 2.
  std::vector<ImportNote> notes;
  auto c = load_train_config(
      kConfigs + "zero_tiny.toml",
      accelerate_overrides_from_yaml("distributed_type: DEEPSPEED\nnum_processes: 2\n"
                                     "mixed_precision: bf16\ndeepspeed_config:\n"
                                     "  deepspeed_multinode_launcher: standard\n",
                                     "acc.yaml", 2, &notes));
  EXPECT_EQ(c.parallel.strategy, ParallelStrategy::kZero);
  EXPECT_EQ(c.parallel.zero.stage, 2);
  EXPECT_EQ(c.precision.param_dtype, "bf16");
  EXPECT_EQ(c.precision.autocast, "none");
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0].file_key, "deepspeed_config.zero_stage");
  const auto via_ds = load_train_config(
      kConfigs + "zero_tiny.toml",
      deepspeed_overrides_from_json(R"({"bf16": {"enabled": true}, "zero_optimization":
                                        {"stage": 2}})",
                                    "ds.json", 2));
  EXPECT_EQ(via_ds.precision.param_dtype, c.precision.param_dtype);
  EXPECT_EQ(via_ds.precision.reduce_dtype, c.precision.reduce_dtype);
  // A deepspeed_config_file is read by the DeepSpeed importer; other keys beside it are named.
  c = resolve(
      "distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n"
      "  deepspeed_config_file: " +
      kConfigs + "ds_zero2.json\n  zero3_init_flag: false\n");
  EXPECT_EQ(c.parallel.zero.stage, 2);
  EXPECT_EQ(c.train.micro_batch, 4);
  const auto e = error_of(
      "distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n"
      "  deepspeed_config_file: " +
      kConfigs + "ds_zero2.json\n  zero_stage: 3\n");
  EXPECT_NE(e.find("'deepspeed_config.zero_stage' = '3': comes from deepspeed_config_file"),
            std::string::npos)
      << e;
}

TEST(AccelerateConfigTest, UlyssesSequenceParallelismIsContextParallelism) {
  // TRL's ALST/Ulysses file: ZeRO-3 over 2 ranks, sequences split over 2.
  const std::string yaml =
      "distributed_type: DEEPSPEED\nnum_processes: 4\nmixed_precision: bf16\n"
      "deepspeed_config:\n  zero_stage: 3\n  seq_parallel_communication_data_type: bf16\n"
      "parallelism_config:\n  parallelism_config_dp_shard_size: 2\n"
      "  parallelism_config_sp_size: 2\n  parallelism_config_sp_backend: deepspeed\n"
      "  parallelism_config_sp_attn_implementation: flash_attention_2\n";
  std::vector<ImportNote> notes;
  const TrainConfig c = load_train_config(
      kConfigs + "zero_tiny.toml", accelerate_overrides_from_yaml(yaml, "acc.yaml", 4, &notes));
  EXPECT_EQ(c.parallel.cp, 2);
  EXPECT_EQ(c.parallel.strategy, ParallelStrategy::kZero);
  EXPECT_EQ(c.parallel.zero.stage, 3);
  std::vector<std::string> keys;
  for (const auto& note : notes) keys.push_back(note.file_key);
  EXPECT_NE(std::find(keys.begin(), keys.end(), "parallelism_config.parallelism_config_sp_size"),
            keys.end());
  EXPECT_NE(
      std::find(keys.begin(), keys.end(), "deepspeed_config.seq_parallel_communication_data_type"),
      keys.end());
  auto e = error_of(yaml + "  parallelism_config_cp_size: 2\n", 4);
  EXPECT_NE(e.find("parallelism_config_sp_size and parallelism_config_cp_size both split"),
            std::string::npos)
      << e;
  std::string bad = yaml;
  bad.replace(bad.find("communication_data_type: bf16"), 29, "communication_data_type: int8");
  e = error_of(bad, 4);
  EXPECT_NE(e.find("seq_parallel_communication_data_type' = \"int8\": expected"), std::string::npos)
      << e;
}

}  // namespace accelerate_config_test
}  // namespace shardtrain
