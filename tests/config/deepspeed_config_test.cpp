// The ds_config.json importer: the example files, "auto" resolution, and errors that name the key.
#include <gtest/gtest.h>

#include <algorithm>

#include "shardtrain/config.h"

namespace shardtrain {
namespace deepspeed_config_test {

const std::string kConfigs = std::string(SHARDTRAIN_SOURCE_DIR) + "/configs/";

std::vector<std::string> sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

std::string error_of(const std::string& json, int world_size = 2) {
  try {
    deepspeed_overrides_from_json(json, "ds.json", world_size);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TrainConfig with_tiny(const std::vector<std::string>& overrides) {
  return load_train_config(kConfigs + "zero_tiny.toml", overrides);
}

// The file keys of the notes that record a default the importer chose (not the TOML's).
std::vector<std::string> decided(const std::vector<ImportNote>& notes) {
  std::vector<std::string> keys;
  for (const auto& note : notes) {
    if (!note.text.empty()) keys.push_back(note.file_key);
  }
  return sorted(keys);
}

TEST(DeepSpeedConfigTest, ZeroTwoExampleGivesItsOverrides) {
  // train_batch_size 16 = micro 4 x accumulation x 2 ranks: accumulation 2.
  const auto got = deepspeed_overrides(kConfigs + "ds_zero2.json", 2);
  EXPECT_EQ(
      sorted(got),
      sorted({"train.micro_batch=4", "train.grad_accum=2", "run.log_every=5",
              "train.optimizer=\"adamw\"", "train.schedule=\"linear\"",
              "train.warmup_type=\"linear\"", "train.min_lr=0.0", "parallel.strategy=\"zero\"",
              "parallel.zero.stage=2", "parallel.zero.offload_optimizer=\"none\"",
              "parallel.zero.allgather_bucket_size=200000000", "parallel.zero.overlap_comm=true",
              "parallel.zero.reduce_bucket_size=200000000"}));
  const TrainConfig config = with_tiny(got);
  EXPECT_EQ(config.parallel.strategy, ParallelStrategy::kZero);
  EXPECT_EQ(config.parallel.zero.stage, 2);
  EXPECT_EQ(config.train.micro_batch * config.train.grad_accum * 2, 16);
  EXPECT_EQ(config.parallel.zero.reduce_bucket_size, 200000000);
  EXPECT_EQ(config.precision.param_dtype,
            "fp32");  // bf16 and fp16 "auto": the TOML's precision stays
  EXPECT_EQ(config.precision.autocast, "none");
  EXPECT_DOUBLE_EQ(config.train.lr, 3e-3);  // optimizer "auto": the TOML's
  // On one rank the same global batch takes four accumulation steps.
  const TrainConfig one = with_tiny(deepspeed_overrides(kConfigs + "ds_zero2.json", 1));
  EXPECT_EQ(one.train.micro_batch, 4);
  EXPECT_EQ(one.train.grad_accum, 4);
}

TEST(DeepSpeedConfigTest, ZeroThreeOffloadExampleResolves) {
  const TrainConfig config = with_tiny(deepspeed_overrides(kConfigs + "ds_zero3_offload.json", 4));
  EXPECT_EQ(config.parallel.strategy, ParallelStrategy::kZero);
  EXPECT_EQ(config.parallel.zero.stage, 3);
  EXPECT_EQ(config.parallel.zero.offload_optimizer, OffloadDevice::kCpu);
  EXPECT_EQ(config.parallel.zero.offload_param, OffloadDevice::kCpu);
  EXPECT_TRUE(config.parallel.zero.pin_memory);
  EXPECT_EQ(config.parallel.zero.max_live_parameters, 1000000000);
  EXPECT_EQ(config.parallel.zero.prefetch_bucket_size,
            TrainConfig().parallel.zero.prefetch_bucket_size);  // auto
  EXPECT_EQ(config.train.micro_batch, 2);
  EXPECT_EQ(config.train.grad_accum, 4);
  EXPECT_EQ(config.precision.param_dtype, "bf16");
  EXPECT_EQ(config.precision.reduce_dtype, "bf16");
  EXPECT_DOUBLE_EQ(config.train.clip, 1.0);
  EXPECT_DOUBLE_EQ(config.train.lr, 3e-3);
  EXPECT_DOUBLE_EQ(config.train.beta2, 0.95);
  EXPECT_EQ(config.train.warmup, 10);
  EXPECT_EQ(config.train.schedule, "cosine");
  EXPECT_NEAR(config.train.min_lr, 0.1 * 3e-3, 1e-15);  // cos_min_ratio x lr
  EXPECT_EQ(config.train.steps, 40);                    // total_num_steps "auto": the TOML's
  EXPECT_EQ(config.run.log_every, 10);
}

TEST(DeepSpeedConfigTest, BatchSizesResolveFromTheOtherTwo) {
  auto config = [](const std::string& json, int world) {
    return with_tiny(deepspeed_overrides_from_json(json, "ds.json", world));
  };
  auto c = config(R"({"train_batch_size": 24, "gradient_accumulation_steps": 3})", 4);
  EXPECT_EQ(c.train.micro_batch, 2);
  EXPECT_EQ(c.train.grad_accum, 3);
  c = config(R"({"train_batch_size": 12})", 3);  // DeepSpeed: accumulation 1
  EXPECT_EQ(c.train.micro_batch, 4);
  EXPECT_EQ(c.train.grad_accum, 1);
  c = config(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 5,
                 "gradient_accumulation_steps": "auto"})",
             2);
  EXPECT_EQ(c.train.micro_batch, 5);
  EXPECT_EQ(c.train.grad_accum, 1);  // the TOML's
}

TEST(DeepSpeedConfigTest, InconsistentBatchSizesNameAllThree) {
  const auto e = error_of(R"({"train_batch_size": 24, "train_micro_batch_size_per_gpu": 4,
                              "gradient_accumulation_steps": 2})");
  EXPECT_NE(e.find("train_batch_size 24"), std::string::npos) << e;
  EXPECT_NE(e.find("train_micro_batch_size_per_gpu 4"), std::string::npos) << e;
  EXPECT_NE(e.find("gradient_accumulation_steps 2"), std::string::npos) << e;
  EXPECT_NE(e.find("2 ranks (= 16)"), std::string::npos) << e;
  const auto d = error_of(R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4})");
  EXPECT_NE(d.find("not divisible"), std::string::npos) << d;
}

TEST(DeepSpeedConfigTest, ZeroOneAdamTakesItsIntervals) {
  const TrainConfig c = with_tiny(deepspeed_overrides_from_json(
      R"({"train_micro_batch_size_per_gpu": 1,
          "optimizer": {"type": "ZeroOneAdam",
                        "params": {"lr": 1e-3, "bias_correction": true, "var_freeze_step": 50,
                                   "var_update_scaler": 8, "local_step_scaler": 100,
                                   "local_step_clipper": 4, "cuda_aware": false,
                                   "comm_backend_name": "nccl"}}})",
      "ds.json", 1));
  EXPECT_EQ(c.train.optimizer, "zero_one_adam");
  EXPECT_FALSE(c.train.bias_correction);  // DeepSpeed's ZeroOneAdam applies none
  EXPECT_EQ(c.train.var_freeze_step, 50);
  EXPECT_EQ(c.train.var_update_scaler, 8);
  EXPECT_EQ(c.train.local_step_scaler, 100);
  EXPECT_EQ(c.train.local_step_clipper, 4);
}

// A DeepSpeedExamples random-LTD block for a model of `total` blocks, with `extra` inside it.
std::string random_ltd(int total, const std::string& extra = "") {
  return R"({"train_micro_batch_size_per_gpu": 1, "data_efficiency": {"enabled": true, "seed": 1,
    "data_routing": {"enabled": true, "random_ltd": {"enabled": true, "total_layer_num": )" +
         std::to_string(total) + R"(, "random_ltd_layer_num": 1, "random_ltd_layer_id": [1],
      "model_mask_name": "attention_mask", "model_type": "decoder",
      "hidden_state_order": "batch_seq_dim", )" +
         extra + R"(
      "random_ltd_schedule": {"min_value": 16, "max_value": 64, "schedule_type": "fixed_linear",
        "schedule_config": {"require_steps": 40, "seq_per_step": 8}}}}}})";
}

TEST(DeepSpeedConfigTest, RandomLtdBecomesTrainRandomLtd) {
  const TrainConfig ltd = with_tiny(deepspeed_overrides_from_json(random_ltd(2), "ds.json", 1));
  EXPECT_EQ(ltd.train.random_ltd_layers, std::vector<int64_t>{1});
  EXPECT_EQ(ltd.train.random_ltd_min, 16);
  EXPECT_EQ(ltd.train.random_ltd_max, 64);
  EXPECT_EQ(ltd.train.random_ltd_steps, 40);
  EXPECT_EQ(ltd.train.random_ltd_step, 8);
  EXPECT_EQ(ltd.train.random_ltd_model_layers, 2);
  // Switched off at any level (DeepSpeed's switches default to off): nothing.
  for (
      const std::string off :
      {R"({"data_efficiency": {"data_routing": {"enabled": true, "random_ltd": {"enabled": true}}}})",
       R"({"data_efficiency": {"enabled": true, "data_routing": {"random_ltd": {"enabled": true}}}})",
       R"({"data_efficiency": {"enabled": true, "data_routing": {"enabled": true,
              "random_ltd": {"enabled": false, "random_ltd_layer_id": [5]}}}})"}) {
    EXPECT_TRUE(
        with_tiny(deepspeed_overrides_from_json(off, "ds.json", 1)).train.random_ltd_layers.empty())
        << off;
  }
  // A model of another block count is refused by the config check, naming both counts.
  try {
    with_tiny(deepspeed_overrides_from_json(random_ltd(12), "ds.json", 1));
    ADD_FAILURE() << "12 blocks accepted for the 2-block model";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("train.random_ltd_model_layers = 12"), std::string::npos)
        << e.what();
  }
  auto e = error_of(random_ltd(2, R"("model_type": "encoder",)"), 1);
  EXPECT_NE(e.find("random-LTD for encoder (bidirectional) models is not available"),
            std::string::npos)
      << e;
  e = error_of(random_ltd(2, R"("layer_token_lr_schedule": {"enabled": true},)"), 1);
  EXPECT_NE(e.find("'data_efficiency.data_routing.random_ltd.layer_token_lr_schedule'"),
            std::string::npos)
      << e;
  EXPECT_EQ(error_of(random_ltd(2, R"("layer_token_lr_schedule": {"enabled": false},)"), 1), "");
  e = error_of(random_ltd(2, R"("random_ltd_layer_num": 3,)"), 1);
  EXPECT_NE(e.find("random_ltd_layer_num' = 3 but random_ltd_layer_id lists 1 blocks"),
            std::string::npos)
      << e;
  e = error_of(R"({"data_efficiency": {"enabled": true, "data_routing": {"enabled": true,
      "random_ltd": {"enabled": true, "random_ltd_layer_id": [1], "total_layer_num": 2}}}})",
               1);
  EXPECT_NE(e.find("'data_efficiency.data_routing.random_ltd.random_ltd_schedule.min_value' is "
                   "missing"),
            std::string::npos)
      << e;
  e = error_of(R"({"data_efficiency": {"enabled": true, "data_sampling": {"enabled": true}}})", 1);
  EXPECT_NE(e.find("curriculum learning"), std::string::npos) << e;
  e = error_of(random_ltd(2, R"("random_ltd_layer_idx": [1],)"), 1);
  EXPECT_NE(
      e.find("'data_efficiency.data_routing.random_ltd.random_ltd_layer_idx' is not supported"),
      std::string::npos)
      << e;
}

TEST(DeepSpeedConfigTest, ProgressiveLayerDropBecomesTrainLayerDrop) {
  const TrainConfig pld = with_tiny(deepspeed_overrides_from_json(
      R"({"train_micro_batch_size_per_gpu": 1,
          "progressive_layer_drop": {"enabled": true, "theta": 0.5, "gamma": 0.002}})",
      "ds.json", 1));
  EXPECT_EQ(pld.train.layer_drop, "progressive");
  EXPECT_EQ(pld.train.layer_drop_theta, 0.5);
  EXPECT_EQ(pld.train.layer_drop_gamma, 0.002);
  // DeepSpeed's defaults: theta 1.0 (every block kept) and gamma 0.001.
  const TrainConfig defaults = with_tiny(deepspeed_overrides_from_json(
      R"({"train_micro_batch_size_per_gpu": 1, "progressive_layer_drop": {"enabled": true}})",
      "ds.json", 1));
  EXPECT_EQ(defaults.train.layer_drop_theta, 1.0);
  EXPECT_EQ(defaults.train.layer_drop_gamma, 0.001);
  const TrainConfig off = with_tiny(deepspeed_overrides_from_json(
      R"({"train_micro_batch_size_per_gpu": 1,
          "progressive_layer_drop": {"enabled": false, "theta": 0.5}})",
      "ds.json", 1));
  EXPECT_EQ(off.train.layer_drop, "none");
  auto e = error_of(R"({"progressive_layer_drop": {"enabled": true, "keep": 0.5}})");
  EXPECT_NE(e.find("'progressive_layer_drop.keep'"), std::string::npos) << e;
  e = error_of(R"({"progressive_layer_drop": {"enabled": true, "theta": "half"}})");
  EXPECT_NE(e.find("'progressive_layer_drop.theta'"), std::string::npos) << e;
  // With a strategy that gathers blocks as they run, the trainer's config check refuses it.
  try {
    with_tiny(deepspeed_overrides_from_json(
        R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
            "progressive_layer_drop": {"enabled": true, "theta": 0.5}})",
        "ds.json", 2));
    ADD_FAILURE() << "ZeRO-3 with progressive layer dropping accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("train.layer_drop"), std::string::npos)
        << error.what();
  }
}

TEST(DeepSpeedConfigTest, Fp32GradientAccumulationReducesInFp32) {
  // data_types.grad_accum_dtype = "fp32" beside bf16 weights: gradients kept and reduced in fp32.
  const auto json = R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true},
                        "zero_optimization": {"stage": 2},
                        "data_types": {"grad_accum_dtype": "fp32"}})";
  const TrainConfig fp32 = with_tiny(deepspeed_overrides_from_json(json, "ds.json", 1));
  EXPECT_EQ(fp32.precision.param_dtype, "bf16");
  EXPECT_EQ(fp32.precision.reduce_dtype, "fp32");
  const TrainConfig bf16 = with_tiny(deepspeed_overrides_from_json(
      R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true},
          "zero_optimization": {"stage": 2}, "data_types": {"grad_accum_dtype": "bf16"}})",
      "ds.json", 1));
  EXPECT_EQ(bf16.precision.reduce_dtype, "bf16");
  auto e = error_of(R"({"data_types": {"grad_accum_dtype": "int8"}})");
  EXPECT_NE(e.find("'data_types.grad_accum_dtype'"), std::string::npos) << e;
  EXPECT_NE(e.find("int8"), std::string::npos) << e;
  e = error_of(R"({"data_types": {"params_dtype": "fp32"}})");
  EXPECT_NE(e.find("'data_types.params_dtype'"), std::string::npos) << e;
}

TEST(DeepSpeedConfigTest, UnknownKeysAreNamedWithTheirPath) {
  auto e = error_of(R"({"zero_optimization": {"stage": 3, "stage3_foo": 1}})");
  EXPECT_NE(e.find("'zero_optimization.stage3_foo'"), std::string::npos) << e;
  EXPECT_NE(e.find("ds.json"), std::string::npos) << e;
  e = error_of(R"({"zero_optimization": {"offload_param": {"device": "cpu", "bogus": 1}}})");
  EXPECT_NE(e.find("'zero_optimization.offload_param.bogus'"), std::string::npos) << e;
  e = error_of(R"({"flops_profiler": {}})");
  EXPECT_NE(e.find("'flops_profiler'"), std::string::npos) << e;
  e = error_of(R"({"optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "foo": 2}}})");
  EXPECT_NE(e.find("'optimizer.params.foo'"), std::string::npos) << e;
}

TEST(DeepSpeedConfigTest, UnsupportedValuesNameKeyAndValue) {
  auto e =
      error_of(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "gpu"}}})");
  EXPECT_NE(e.find("'zero_optimization.offload_optimizer.device' = \"gpu\""), std::string::npos)
      << e;
  e = error_of(R"({"zero_optimization": {"stage": 4}})");
  EXPECT_NE(e.find("'zero_optimization.stage' = 4"), std::string::npos) << e;
  e = error_of(R"({"zero_optimization": {"stage": 2, "reduce_scatter": false}})");
  EXPECT_NE(e.find("'zero_optimization.reduce_scatter' = false"), std::string::npos) << e;
  e = error_of(R"({"fp16": {"enabled": true, "hysteresis": 0}})");
  EXPECT_NE(e.find("'fp16.hysteresis' = 0"), std::string::npos) << e;
  e = error_of(R"({"optimizer": {"type": "Lamb", "params": {"max_grad_norm": 1.0}}})");
  EXPECT_NE(e.find("'optimizer.params.max_grad_norm' = 1.0"), std::string::npos) << e;
  e = error_of(R"({"optimizer": {"type": "Adagrad", "params": {}}})");
  EXPECT_NE(e.find("'optimizer.type' = \"Adagrad\""), std::string::npos) << e;
  e = error_of(R"({"optimizer": {"type": "ZeroOneAdam", "params": {"freeze_step": 10}}})");
  EXPECT_NE(e.find("'optimizer.params.freeze_step'"), std::string::npos) << e;
  e = error_of(R"({"scheduler": {"type": "OneCycle", "params": {}}})");
  EXPECT_NE(e.find("'scheduler.type' = \"OneCycle\""), std::string::npos) << e;
  e = error_of(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cubic"}}})");
  EXPECT_NE(e.find("'scheduler.params.warmup_type' = \"cubic\""), std::string::npos) << e;
  e = error_of(R"({"bf16": {"enabled": true}, "fp16": {"enabled": true}})");
  EXPECT_NE(e.find("cannot both be true"), std::string::npos) << e;
  // Values are checked once, by TrainConfig::validate.
  try {
    with_tiny(deepspeed_overrides_from_json(R"({"gradient_clipping": -1})", "ds.json", 1));
    ADD_FAILURE() << "a negative gradient_clipping was accepted";
  } catch (const std::invalid_argument& err) {
    EXPECT_NE(std::string(err.what()).find("train.clip"), std::string::npos) << err.what();
  }
  // DeepSpeed reads offload_param only at stage 3: below it, it is ignored and said so.
  std::vector<ImportNote> notes;
  const TrainConfig c = with_tiny(deepspeed_overrides_from_json(
      R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})", "ds.json", 1,
      &notes));
  EXPECT_EQ(c.parallel.zero.offload_param, OffloadDevice::kNone);
  EXPECT_EQ(decided(notes), std::vector<std::string>{"zero_optimization.offload_param.device"});
}

TEST(DeepSpeedConfigTest, StageZeroIsDdpAndFp16MapsLossScaling) {
  auto c = with_tiny(
      deepspeed_overrides_from_json(R"({"zero_optimization": {"stage": 0}})", "ds.json", 2));
  EXPECT_EQ(c.parallel.strategy, ParallelStrategy::kDdp);
  c = with_tiny(deepspeed_overrides_from_json(
      R"({"fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12,
                   "loss_scale_window": 500, "hysteresis": 1, "min_loss_scale": 2}})",
      "ds.json", 1));
  EXPECT_EQ(c.precision.autocast, "fp16");
  EXPECT_EQ(c.precision.loss_scale, "dynamic");
  EXPECT_DOUBLE_EQ(c.precision.initial_scale, 4096.0);  // 2^12
  EXPECT_EQ(c.precision.scale_window, 500);
  EXPECT_DOUBLE_EQ(c.precision.min_scale, 2.0);
  c = with_tiny(deepspeed_overrides_from_json(R"({"fp16": {"enabled": true, "loss_scale": 128}})",
                                              "ds.json", 1));
  EXPECT_DOUBLE_EQ(std::stod(c.precision.loss_scale), 128.0);
}

TEST(DeepSpeedConfigTest, SchedulersMapOntoOurSchedules) {
  auto c = with_tiny(deepspeed_overrides_from_json(
      R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.002,
          "warmup_num_steps": 7, "warmup_type": "linear"}}})",
      "ds.json", 1));
  EXPECT_EQ(c.train.schedule, "constant");
  EXPECT_DOUBLE_EQ(c.train.lr, 0.002);
  EXPECT_EQ(c.train.warmup, 7);
  c = with_tiny(deepspeed_overrides_from_json(
      R"({"optimizer": {"type": "Adam", "params": {"lr": 0.001}},
          "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 30,
          "warmup_num_steps": 3, "warmup_type": "linear"}}})",
      "ds.json", 1));
  EXPECT_EQ(c.train.schedule, "linear");
  EXPECT_EQ(c.train.steps, 30);
  EXPECT_DOUBLE_EQ(c.train.min_lr, 0.0);
  const auto e = error_of(R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.002, "warmup_type": "linear"}}})");
  EXPECT_NE(e.find("'scheduler.params.warmup_max_lr' = 0.002"), std::string::npos) << e;
}

TEST(DeepSpeedConfigTest, Fp16TakesDeepSpeedsHysteresis) {
  auto c = with_tiny(deepspeed_overrides_from_json(
      R"({"fp16": {"enabled": true, "hysteresis": 4, "consecutive_hysteresis": true}})", "ds.json",
      1));
  EXPECT_EQ(c.precision.hysteresis, 4);
  EXPECT_TRUE(c.precision.consecutive_hysteresis);
  std::vector<ImportNote> notes;
  c = with_tiny(
      deepspeed_overrides_from_json(R"({"fp16": {"enabled": true}})", "ds.json", 1, &notes));
  EXPECT_EQ(c.precision.hysteresis, 2);  // DeepSpeed's default, said in a note
  EXPECT_FALSE(c.precision.consecutive_hysteresis);
  EXPECT_EQ(decided(notes), sorted({"fp16.hysteresis", "zero_optimization"}));
  // Off, the TOML's single-overflow behaviour stays.
  c = with_tiny(deepspeed_overrides_from_json(R"({"fp16": {"enabled": false, "hysteresis": 2}})",
                                              "ds.json", 1));
  EXPECT_EQ(c.precision.hysteresis, 1);
}

TEST(DeepSpeedConfigTest, DeepSpeedsSchedulerDefaultsApply) {
  // No warmup_type: DeepSpeed's log warmup; no warmup_num_steps: 1000; no warmup_max_lr: 0.001.
  std::vector<ImportNote> notes;
  auto c = with_tiny(deepspeed_overrides_from_json(
      R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0}}})", "ds.json", 1,
      &notes));
  EXPECT_EQ(c.train.schedule, "constant");
  EXPECT_EQ(c.train.warmup_type, "log");
  EXPECT_EQ(c.train.warmup, 1000);
  EXPECT_DOUBLE_EQ(c.train.lr, 1e-3);
  EXPECT_EQ(decided(notes),
            sorted({"scheduler.params.warmup_max_lr", "scheduler.params.warmup_num_steps",
                    "scheduler.params.warmup_type", "zero_optimization"}));
  // An optimizer without a scheduler: its learning rate throughout, below the TOML's min_lr too.
  c = with_tiny(deepspeed_overrides_from_json(
      R"({"optimizer": {"type": "AdamW", "params": {"lr": 1e-5}}})", "ds.json", 1));
  EXPECT_EQ(c.train.schedule, "constant");
  EXPECT_EQ(c.train.warmup, 0);
  EXPECT_DOUBLE_EQ(c.train.lr, 1e-5);
  // Neither: the TOML's optimizer and schedule, as a trainer that builds its own would.
  c = with_tiny(deepspeed_overrides_from_json(R"({"train_batch_size": 8})", "ds.json", 1));
  EXPECT_EQ(c.train.schedule, "cosine");
  EXPECT_EQ(c.train.warmup, 5);
}

TEST(DeepSpeedConfigTest, KnobsWithTheSameResultsAreAccepted) {
  const auto got = deepspeed_overrides_from_json(
      R"({"prescale_gradients": true, "gradient_predivide_factor": 2.0,
          "zero_optimization": {"stage": 2, "round_robin_gradients": true}})",
      "ds.json", 2);
  EXPECT_EQ(with_tiny(got).parallel.zero.stage, 2);
}

TEST(DeepSpeedConfigTest, EveryAutoIsToldWithTheValueItBecame) {
  std::vector<ImportNote> notes;
  const auto got = deepspeed_overrides(kConfigs + "ds_zero2.json", 2, &notes);
  const TrainConfig config = with_tiny(got);
  const auto lines = describe_import_notes(config, "ds_zero2.json", notes);
  auto has = [&](const std::string& text) {
    return std::any_of(lines.begin(), lines.end(),
                       [&](const std::string& line) { return line == text; });
  };
  std::string all;
  for (const auto& line : lines) all += line + "\n";
  EXPECT_TRUE(has("ds_zero2.json: 'optimizer.params.lr' left to the TOML config: train.lr = 0.003"))
      << all;
  EXPECT_TRUE(
      has("ds_zero2.json: 'bf16.enabled' left to the TOML config: precision.param_dtype = "
          "\"fp32\", precision.autocast = \"none\""))
      << all;
  EXPECT_TRUE(has("ds_zero2.json: 'gradient_clipping' left to the TOML config: train.clip = 1"))
      << all;
  EXPECT_TRUE(
      has("ds_zero2.json: 'scheduler.params.total_num_steps' left to the TOML config: "
          "train.steps = 40"))
      << all;
  // Every "auto" in the file is told: lr, betas (two keys), eps, weight_decay, warmup_max_lr,
  // warmup_num_steps, total_num_steps, fp16, bf16, gradient_accumulation_steps (derived here, so
  // not "auto" any more) and gradient_clipping.
  EXPECT_EQ(lines.size(), 11u) << all;
}

TEST(DeepSpeedConfigTest, LoggingAndLauncherKeysPassAndMissingFeaturesAreNamed) {
  const auto got = deepspeed_overrides_from_json(
      R"({"_comment": "x", "tensorboard": {"enabled": true}, "cuda_visible_devices": 0,
          "compression_training": {"weight_quantization": {"shared_parameters":
                                                            {"enabled": false}}},
          "zero_optimization": {"stage": 1, "cpu_offload": true, "disable_allgather": true},
          "bf16": {"enabled": true, "loss_scale": 0, "hysteresis": 2}})",
      "ds.json", 2);
  // A compression section is refused only when it is on.
  auto e = error_of(
      R"({"compression_training": {"sparse_pruning": {"shared_parameters": {"enabled": true}}}})");
  EXPECT_NE(e.find("'compression_training.sparse_pruning': DeepSpeed's sparse pruning is not "
                   "available in shardtrain"),
            std::string::npos)
      << e;
  e = error_of(R"({"data_efficiency": {"enabled": false}})");
  EXPECT_EQ(e, "");
  const TrainConfig c = with_tiny(got);
  EXPECT_EQ(c.parallel.zero.offload_optimizer, OffloadDevice::kCpu);  // the older spelling
}

TEST(DeepSpeedConfigTest, AutoTpIsTensorParallelismAndTheBatchCountsDataParallelRanks) {
  // 4 ranks at autotp 2: two data-parallel ranks, so 16 = micro 4 x accumulation 2 x 2.
  const TrainConfig c = with_tiny(deepspeed_overrides_from_json(
      R"({"tensor_parallel": {"autotp_size": 2}, "train_batch_size": 16,
          "train_micro_batch_size_per_gpu": 4})",
      "ds.json", 4));
  EXPECT_EQ(c.parallel.tp, 2);
  EXPECT_EQ(c.train.grad_accum, 2);
}

TEST(DeepSpeedConfigTest, CompressionTrainingQuantizationIsTheCompressionSection) {
  // DeepSpeedExamples' GPT-2 file: 4-bit MLP and 8-bit attention weights, 8-bit inputs.
  const std::string file = R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4,
    "fp16": {"enabled": true},
    "compression_training": {
      "weight_quantization": {
        "shared_parameters": {"enabled": true, "quantizer_kernel": false, "schedule_offset": 0,
          "quantize_groups": 64, "quantize_verbose": false, "quantization_type": "symmetric",
          "quantize_weight_in_forward": false, "rounding": "nearest",
          "fp16_mixed_quantize": {"enabled": false, "quantize_change_ratio": 1}},
        "different_groups": {
          "wq1": {"params": {"start_bits": 4, "target_bits": 4, "quantization_period": 0},
                  "modules": ["mlp.c_fc", "mlp.c_proj"]},
          "wq2": {"params": {"start_bits": 8, "target_bits": 8, "quantization_period": 0},
                  "modules": ["attn.c_attn", "attn.c_proj"]}}},
      "activation_quantization": {
        "shared_parameters": {"enabled": true, "quantization_type": "asymmetric",
                              "range_calibration": "dynamic"},
        "different_groups": {"aq1": {"params": {"bits": 8}, "modules": ["attn.c_attn"]}}},
      "sparse_pruning": {"shared_parameters": {"enabled": false}}}})";
  std::vector<ImportNote> notes;
  const TrainConfig c = with_tiny(deepspeed_overrides_from_json(file, "ds.json", 2, &notes));
  EXPECT_EQ(c.compression.weight_bits, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(c.compression.weight_modules,
            (std::vector<std::vector<std::string>>{{"mlp.c_fc", "mlp.c_proj"},
                                                   {"attn.c_attn", "attn.c_proj"}}));
  EXPECT_EQ(c.compression.weight_groups, 64);
  EXPECT_EQ(c.compression.weight_offset, 0);
  EXPECT_EQ(c.compression.activation_bits, (std::vector<int64_t>{8}));
  EXPECT_EQ(c.compression.activation_type, "asymmetric");
  // Without a schedule_offset DeepSpeed starts activation quantization at step 1000: said so.
  EXPECT_EQ(c.compression.activation_offset, 1000);
  const auto keys = decided(notes);
  EXPECT_NE(std::find(keys.begin(), keys.end(),
                      "compression_training.activation_quantization.shared_parameters."
                      "schedule_offset"),
            keys.end());

  auto refused = [&](const std::string& from, const std::string& to) {
    std::string changed = file;
    const size_t at = changed.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return error_of(changed.replace(at, from.size(), to));
  };
  // Weights quantized after each step exist only as fp16 or bf16 copies.
  auto e = refused(R"("fp16": {"enabled": true})", R"("fp16": {"enabled": false})");
  EXPECT_NE(e.find("'compression_training.weight_quantization.shared_parameters.quantize_weight_"
                   "in_forward' = false: without fp16 or bf16"),
            std::string::npos)
      << e;
  e = refused(R"("start_bits": 4)", R"("start_bits": 8)");
  EXPECT_NE(e.find("different_groups.wq1.params.start_bits' = 8: the schedule from start_bits"),
            std::string::npos)
      << e;
  e = refused(R"("rounding": "nearest")", R"("rounding": "stochastic")");
  EXPECT_NE(e.find("only \"nearest\" rounding"), std::string::npos) << e;
  e = refused(R"("range_calibration": "dynamic")", R"("range_calibration": "static")");
  EXPECT_NE(e.find("range_calibration' = \"static\""), std::string::npos) << e;
  e = refused(R"("sparse_pruning": {"shared_parameters": {"enabled": false}})",
              R"("layer_reduction": {"enabled": true})");
  EXPECT_NE(e.find("'compression_training.layer_reduction': layer reduction"), std::string::npos)
      << e;
  e = refused(R"("modules": ["attn.c_attn"])", R"("module": ["attn.c_attn"])");
  EXPECT_NE(e.find("different_groups.aq1.module' is not supported"), std::string::npos) << e;
}

TEST(DeepSpeedConfigTest, UlyssesCommunicationDtypeIsAcceptedAndTold) {
  std::vector<ImportNote> notes;
  deepspeed_overrides_from_json(R"({"seq_parallel_comm_data_type": "BF16"})", "ds.json", 2, &notes);
  EXPECT_EQ(decided(notes), sorted({"seq_parallel_comm_data_type", "zero_optimization"}));
  const auto e = error_of(R"({"seq_parallel_communication_data_type": "int8"})");
  EXPECT_NE(e.find("'seq_parallel_communication_data_type' = \"int8\": expected"),
            std::string::npos)
      << e;
}

TEST(DeepSpeedConfigTest, AutotuningTunesTheMicroBatchTheFileLeavesOpen) {
  std::vector<ImportNote> notes;
  TrainConfig c = with_tiny(deepspeed_overrides_from_json(
      R"({"train_micro_batch_size_per_gpu": "auto",
          "autotuning": {"enabled": true, "overwrite": false, "max_train_batch_size": 4096,
                         "min_train_micro_batch_size_per_gpu": 2, "end_profile_step": 7,
                         "arg_mappings": {"train_micro_batch_size_per_gpu": "--bs"}}})",
      "ds.json", 2, &notes));
  EXPECT_TRUE(c.train.autotune);
  EXPECT_EQ(c.train.autotune_max_batch, 4096);
  EXPECT_EQ(c.train.autotune_min_micro_batch, 2);
  EXPECT_EQ(c.train.autotune_steps, 7);
  EXPECT_EQ(decided(notes), sorted({"train_micro_batch_size_per_gpu", "zero_optimization"}));
  // A global batch the file fixes stays; the accumulation follows each micro-batch.
  c = with_tiny(deepspeed_overrides_from_json(
      R"({"train_batch_size": 64, "autotuning": {"enabled": true}})", "ds.json", 2));
  EXPECT_TRUE(c.train.autotune);
  EXPECT_EQ(c.train.global_batch, 64);
  EXPECT_EQ(c.train.grad_accum, 1);
  // A micro-batch the file fixes is not tuned, as in DeepSpeed; a switched-off block is ignored.
  c = with_tiny(deepspeed_overrides_from_json(
      R"({"train_micro_batch_size_per_gpu": 4, "autotuning": {"enabled": true}})", "ds.json", 2));
  EXPECT_FALSE(c.train.autotune);
  EXPECT_EQ(c.train.micro_batch, 4);
  c = with_tiny(deepspeed_overrides_from_json(
      R"({"autotuning": {"enabled": false, "metric": "latency"}})", "ds.json", 2));
  EXPECT_FALSE(c.train.autotune);
  const auto e = error_of(R"({"autotuning": {"enabled": true, "metric": "latency"}})");
  EXPECT_NE(e.find("'autotuning.metric' = \"latency\": only \"throughput\""), std::string::npos)
      << e;
}

}  // namespace deepspeed_config_test
}  // namespace shardtrain
