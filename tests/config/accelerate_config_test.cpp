// The accelerate config importer: the FSDP example, accelerate's spellings, and clear errors.
#include <gtest/gtest.h>

#include "shardtrain/config.h"

namespace shardtrain {
namespace {

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
  e = error_of(std::string(kBase) + "megatron_lm_config: {}\n");
  EXPECT_NE(e.find("'megatron_lm_config'"), std::string::npos) << e;
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
  e = error_of("distributed_type: MULTI_GPU\nnum_processes: 2\nfsdp_config:\n  fsdp_version: 1\n");
  EXPECT_NE(e.find("'fsdp_config'"), std::string::npos) << e;
  e = error_of(std::string(kBase) + "mixed_precision: fp8\n");
  EXPECT_NE(e.find("'mixed_precision' = 'fp8'"), std::string::npos) << e;
}

TEST(AccelerateConfigTest, NumProcessesMustMatchTheLaunchedWorld) {
  const auto e = error_of("distributed_type: FSDP\nnum_processes: 8\n", 2);
  EXPECT_NE(e.find("'num_processes' = '8'"), std::string::npos) << e;
  EXPECT_NE(e.find("2 rank(s)"), std::string::npos) << e;
  EXPECT_EQ(error_of("distributed_type: FSDP\nnum_processes: 2\n", 2), "");
}

}  // namespace
}  // namespace shardtrain
