// DeepSpeed's ds_config.json as TrainConfig overrides: batch sizes, precision, gradient clipping
// and zero_optimization here; the optimizer and scheduler sections in deepspeed_optimizer.cpp.
#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "config/deepspeed_json.h"
#include "shardtrain/config.h"

namespace shardtrain {
namespace {

using detail::bad_value;
using detail::bool_or_auto;
using detail::int_or_auto;
using detail::is_auto;
using detail::Json;
using detail::number_or_auto;
using detail::Overrides;
using detail::toml_ints;

// train_batch_size = micro × accumulation × data-parallel ranks. A missing or "auto" size is
// derived from the other two; with only the global batch given, DeepSpeed's rule applies
// (accumulation 1). Sizes that stay unknown are left to the TOML config.
void import_batch(const Json& ds, int world_size, Overrides& out) {
  auto read = [&](const char* key) -> std::optional<int64_t> {
    if (!ds.contains(key)) return std::nullopt;
    const auto value = int_or_auto(ds.at(key), key);
    if (value && *value < 1) bad_value(key, ds.at(key), "must be at least 1");
    return value;
  };
  auto total = read("train_batch_size");
  auto micro = read("train_micro_batch_size_per_gpu");
  auto accum = read("gradient_accumulation_steps");
  const int64_t world = world_size;
  auto divide = [&](int64_t whole, int64_t part, const char* derived) {
    if (whole % (part * world) != 0) {
      throw std::invalid_argument("ds_config: train_batch_size " + std::to_string(whole) +
                                  " is not divisible by " + std::to_string(part) + " x " +
                                  std::to_string(world) + " ranks, so " + derived +
                                  " cannot be derived");
    }
    return whole / (part * world);
  };
  if (total && micro && accum) {
    if (*total != *micro * *accum * world) {
      throw std::invalid_argument("ds_config: train_batch_size " + std::to_string(*total) +
                                  " != train_micro_batch_size_per_gpu " + std::to_string(*micro) +
                                  " x gradient_accumulation_steps " + std::to_string(*accum) +
                                  " x " + std::to_string(world) +
                                  " ranks (= " + std::to_string(*micro * *accum * world) + ")");
    }
  } else if (total && micro) {
    accum = divide(*total, *micro, "gradient_accumulation_steps");
  } else if (total && accum) {
    micro = divide(*total, *accum, "train_micro_batch_size_per_gpu");
  } else if (total) {
    accum = 1;
    micro = divide(*total, 1, "train_micro_batch_size_per_gpu");
  }
  out.set_int_or_keep("train_micro_batch_size_per_gpu", "train.micro_batch", micro);
  out.set_int_or_keep("gradient_accumulation_steps", "train.grad_accum", accum);
}

// `data_parallel_only`: ZeRO stage 0 (plain DDP), which has no parameter dtype policy here, so
// bf16 becomes autocast over fp32 weights.
void import_bf16(const Json& section, bool data_parallel_only, Overrides& out) {
  detail::object_at(section, "bf16");
  std::optional<bool> enabled;
  for (const auto& [key, value] : section.items()) {
    const std::string path = "bf16." + key;
    if (key == "enabled") {
      enabled = bool_or_auto(value, path);
    } else if (key == "immediate_grad_update") {
      // Whether bf16 gradients are added into fp32 ones at once or at the step: the same sums.
      bool_or_auto(value, path);
    } else if (key == "loss_scale" || key == "initial_scale_power" || key == "loss_scale_window" ||
               key == "min_loss_scale" || key == "hysteresis" || key == "consecutive_hysteresis") {
      // fp16's loss-scaling keys, copied into a bf16 section: DeepSpeed does not scale bf16.
    } else {
      detail::unknown_key(path);
    }
  }
  if (!enabled) {
    out.keep("bf16.enabled", data_parallel_only ? "precision.autocast" : "precision.param_dtype");
  } else if (*enabled && data_parallel_only) {
    out.set_string("precision.autocast", "bf16");
  } else if (*enabled) {
    // DeepSpeed's bf16 computes with bf16 weights, keeps fp32 master weights in the optimizer
    // and communicates gradients in the model's dtype: bf16.
    out.set_string("precision.param_dtype", "bf16");
    out.set_string("precision.reduce_dtype", "bf16");
    out.set_string("precision.buffer_dtype", "bf16");
  }
}

// data_types.grad_accum_dtype: the dtype gradients are accumulated and reduced in. True for
// "fp32" (shardtrain's precision.reduce_dtype = "fp32"); the parameters' dtype otherwise.
bool import_data_types(const Json& section) {
  detail::object_at(section, "data_types");
  bool fp32 = false;
  for (const auto& [key, value] : section.items()) {
    const std::string path = "data_types." + key;
    if (key != "grad_accum_dtype") detail::unknown_key(path);
    if (!value.is_string() ||
        (value != "fp32" && value != "bf16" && value != "fp16" && value != "auto")) {
      throw std::invalid_argument("ds_config key '" + path +
                                  "' must be \"fp32\", \"bf16\" or \"fp16\", got " + value.dump());
    }
    fp32 = value == "fp32";
  }
  return fp32;
}

void import_fp16(const Json& section, Overrides& out) {
  detail::object_at(section, "fp16");
  const auto enabled_or_auto = section.contains("enabled")
                                   ? bool_or_auto(section.at("enabled"), "fp16.enabled")
                                   : std::optional<bool>(false);
  if (!enabled_or_auto) out.keep("fp16.enabled", "precision.autocast");
  const bool enabled = enabled_or_auto.value_or(false);
  Overrides scaling;
  bool dynamic = true;
  // DeepSpeed lowers the scale at the second overflow in a row unless told otherwise.
  int64_t hysteresis = 2;
  for (const auto& [key, value] : section.items()) {
    const std::string path = "fp16." + key;
    if (key == "enabled" || key == "auto_cast") {
      bool_or_auto(value, path);
    } else if (key == "loss_scale") {
      const auto scale = number_or_auto(value, path);
      if (scale && *scale < 0) bad_value(path, value, "must be 0 (dynamic) or positive");
      if (scale && *scale > 0) {
        dynamic = false;
        scaling.set_float("precision.loss_scale", *scale);
      }
    } else if (key == "initial_scale_power") {
      if (const auto power = int_or_auto(value, path)) {
        scaling.set_float("precision.initial_scale", std::ldexp(1.0, static_cast<int>(*power)));
      } else {
        scaling.keep(path, "precision.initial_scale");
      }
    } else if (key == "loss_scale_window") {
      scaling.set_int_or_keep(path, "precision.scale_window", int_or_auto(value, path));
    } else if (key == "min_loss_scale") {
      scaling.set_float_or_keep(path, "precision.min_scale", number_or_auto(value, path));
    } else if (key == "hysteresis") {
      const auto h = int_or_auto(value, path);
      if (h && *h < 1) bad_value(path, value, "must be at least 1");
      if (h) hysteresis = *h;
    } else if (key == "consecutive_hysteresis") {
      scaling.set_bool_or_keep(path, "precision.consecutive_hysteresis", bool_or_auto(value, path));
    } else {
      detail::unknown_key(path);
    }
  }
  if (!enabled) return;
  out.set_string("precision.autocast", "fp16");
  if (dynamic) out.set_string("precision.loss_scale", "dynamic");
  if (!section.contains("hysteresis")) {
    out.decide("fp16.hysteresis",
               "absent: DeepSpeed's default 2 (the scale is lowered at the "
               "second overflow)");
  }
  out.set_int("precision.hysteresis", hysteresis);
  out.append(scaling);
}

void import_offload(const Json& section, const std::string& name, int64_t stage, Overrides& out,
                    std::optional<bool>& pin, std::optional<std::string>& nvme_path) {
  const std::string prefix = "zero_optimization." + name + ".";
  detail::object_at(section, "zero_optimization." + name);
  for (const auto& [key, value] : section.items()) {
    const std::string path = prefix + key;
    if (key == "device") {
      const std::string device = detail::string_at(value, path);
      if (device != "none" && device != "cpu" && device != "nvme") {
        bad_value(path, value, "expected \"none\", \"cpu\" or \"nvme\"");
      }
      // DeepSpeed reads offload_param only at stage 3 and offload_optimizer from stage 1.
      const int64_t needs = name == "offload_param" ? 3 : 1;
      if (stage < needs && device != "none") {
        out.decide(path, "ignored below stage " + std::to_string(needs) + ", as DeepSpeed does");
        continue;
      }
      out.set_string("parallel.zero." + name, device);
    } else if (key == "pin_memory") {
      const auto this_pin = bool_or_auto(value, path);
      if (this_pin && pin && *pin != *this_pin) {
        bad_value(path, value,
                  "differs from the other offload section's pin_memory; shardtrain has one "
                  "parallel.zero.pin_memory");
      }
      if (this_pin) pin = this_pin;
    } else if (key == "nvme_path") {
      if (value.is_null()) continue;
      const std::string this_path = detail::string_at(value, path);
      if (nvme_path && *nvme_path != this_path) {
        bad_value(path, value,
                  "differs from the other offload section's nvme_path; shardtrain has one "
                  "parallel.zero.nvme_path");
      }
      nvme_path = this_path;
    } else if (key == "buffer_count" || key == "buffer_size" || key == "max_in_cpu" ||
               key == "fast_init") {
      // Sizing of DeepSpeed's asynchronous I/O buffers: how fast offload runs, not what it
      // computes.
      if (!value.is_number() && !value.is_boolean() && !is_auto(value)) {
        bad_value(path, value, "expected a number");
      }
    } else if (key == "ratio" && name == "offload_optimizer") {
      detail::require_value(value, path, 1.0,
                            "only ratio 1.0 is supported (the whole optimizer state is offloaded)");
    } else {
      detail::unknown_key(path);
    }
  }
}

// DeepSpeed's AutoTP: Megatron-style tensor parallelism of the linear layers, which is
// parallel.tp (the data-parallel ranks are then world / tp).
void import_tensor_parallel(const Json& section, Overrides& out) {
  detail::object_at(section, "tensor_parallel");
  for (const auto& [key, value] : section.items()) {
    const std::string path = "tensor_parallel." + key;
    if (key == "autotp_size" || key == "tp_size") {
      const auto size = int_or_auto(value, path);
      if (size && *size < 1) bad_value(path, value, "must be at least 1");
      out.set_int_or_keep(path, "parallel.tp", size);
    } else {
      detail::unknown_key(path);
    }
  }
}

void import_zero(const Json& section, int world_size, Overrides& out) {
  detail::object_at(section, "zero_optimization");
  std::optional<bool> pin;
  std::optional<std::string> nvme_path;
  int64_t stage = 0;
  if (section.contains("stage")) {
    const auto value = int_or_auto(section.at("stage"), "zero_optimization.stage");
    if (!value || *value < 0 || *value > 3) {
      bad_value("zero_optimization.stage", section.at("stage"), "expected 0, 1, 2 or 3");
    }
    stage = *value;
  }
  if (stage == 0) {
    out.set_string("parallel.strategy", "ddp");  // stage 0: plain data parallelism
  } else {
    out.set_string("parallel.strategy", "zero");
    out.set_int("parallel.zero.stage", stage);
  }
  // Keys mapped one to one; "auto" keeps shardtrain's default.
  static const std::map<std::string, std::string> bool_keys = {
      {"overlap_comm", "parallel.zero.overlap_comm"}};
  static const std::map<std::string, std::string> int_keys = {
      {"reduce_bucket_size", "parallel.zero.reduce_bucket_size"},
      {"allgather_bucket_size", "parallel.zero.allgather_bucket_size"},
      {"stage3_prefetch_bucket_size", "parallel.zero.prefetch_bucket_size"},
      {"stage3_param_persistence_threshold", "parallel.zero.param_persistence_threshold"},
      {"stage3_max_live_parameters", "parallel.zero.max_live_parameters"}};
  for (const auto& [key, value] : section.items()) {
    const std::string path = "zero_optimization." + key;
    if (key == "stage") continue;
    if (key == "contiguous_gradients") {
      // Whether gradients are copied into one buffer as they arrive: the same sums. shardtrain
      // always reduces from one buffer per unit.
      bool_or_auto(value, path);
      continue;
    }
    if (key == "reduce_bucket_size" && int_or_auto(value, path) == std::optional<int64_t>(0)) {
      out.set_int("parallel.zero.reduce_bucket_size", 1);  // each gradient reduced alone
      continue;
    }
    if (bool_keys.count(key)) {
      out.set_bool_or_keep(path, bool_keys.at(key), bool_or_auto(value, path));
    } else if (int_keys.count(key)) {
      out.set_int_or_keep(path, int_keys.at(key), int_or_auto(value, path));
    } else if (key == "offload_optimizer" || key == "offload_param") {
      import_offload(value, key, stage, out, pin, nvme_path);
    } else if (key == "reduce_scatter" || key == "allgather_partitions" ||
               key == "load_from_fp32_weights") {
      detail::require_value(value, path, true,
                            "only true is supported (the behaviour shardtrain always has)");
    } else if (key == "round_robin_gradients") {
      // The order in which ranks copy their gradient partitions out: the same sums.
      bool_or_auto(value, path);
    } else if (key == "stage3_gather_16bit_weights_on_model_save" ||
               key == "stage3_gather_fp16_weights_on_model_save") {
      // Checkpoints always record every tensor whole (by slices), so either value is honoured.
      bool_or_auto(value, path);
    } else if (key == "mics_shard_size") {
      continue;  // below, once the stage is known
    } else if (key == "cpu_offload") {
      // The older spelling of offload_optimizer.device = "cpu".
      if (bool_or_auto(value, path).value_or(false) && stage >= 1) {
        out.set_string("parallel.zero.offload_optimizer", "cpu");
      }
    } else if (key == "disable_allgather") {
      // An older ZeRO-1 switch between all-gather and broadcast for the updated shards: the
      // same parameters either way.
      bool_or_auto(value, path);
    } else if (key == "stage3_max_reuse_distance" || key == "sub_group_size") {
      // Caching and step granularity hints: they change memory and speed, not results.
      int_or_auto(value, path);
    } else {
      detail::unknown_key(path);
    }
  }
  if (pin) out.set_bool("parallel.zero.pin_memory", *pin);
  if (nvme_path) out.set_string("parallel.zero.nvme_path", *nvme_path);
  // MiCS: stage 3 sharded inside groups of mics_shard_size ranks and replicated across them,
  // which is FSDP's hybrid_shard.
  if (section.contains("mics_shard_size")) {
    const std::string path = "zero_optimization.mics_shard_size";
    const auto size = int_or_auto(section.at("mics_shard_size"), path);
    if (size && *size > 0) {
      if (stage != 3) bad_value(path, section.at("mics_shard_size"), "MiCS needs stage 3");
      if (world_size % *size != 0) {
        bad_value(path, section.at("mics_shard_size"),
                  "must divide the world size " + std::to_string(world_size));
      }
      const bool offload =
          section.contains("offload_optimizer") || section.contains("offload_param");
      out.set_string("parallel.strategy", "fsdp");
      out.set_string("parallel.fsdp.sharding", "hybrid_shard");
      out.set_int("parallel.fsdp.replicate", world_size / *size);
      if (offload) {
        // FSDP's offload instead of the ZeRO keys the offload sections set.
        out.set_bool("parallel.fsdp.cpu_offload", true);
        out.set_string("parallel.zero.offload_optimizer", "none");
        out.set_string("parallel.zero.offload_param", "none");
      }
    }
  }
}

// Sections of DeepSpeed features shardtrain does not have, with what they are.
const std::map<std::string, std::string>& unavailable_features() {
  static const std::map<std::string, std::string> features = {
      {"curriculum_learning", "DeepSpeed's curriculum learning"},
      {"sparse_attention", "DeepSpeed's sparse attention"},
      {"quantize_training", "quantization-aware training"},
      {"eigenvalue", "DeepSpeed's eigenvalue computation (for quantization schedules)"},
      {"pipeline", "DeepSpeed's pipeline engine settings (use parallel.pp)"},
      {"flops_profiler", "DeepSpeed's FLOPs profiler (run.trace and the report measure steps)"},
      {"elasticity", "DeepSpeed's elastic batch sizes"},
  };
  return features;
}

// progressive_layer_drop: {enabled, theta, gamma} as train.layer_drop (DeepSpeed's defaults:
// off, theta 1.0, gamma 0.001; "auto" keeps the TOML's value).
void import_layer_drop(const Json& value, Overrides& out) {
  const std::string name = "progressive_layer_drop";
  const Json& section = detail::object_at(value, name);
  std::optional<bool> enabled = false;
  std::optional<double> theta = 1.0, gamma = 0.001;
  for (const auto& [key, item] : section.items()) {
    const std::string path = name + "." + key;
    if (key == "enabled") {
      enabled = bool_or_auto(item, path);
    } else if (key == "theta") {
      theta = number_or_auto(item, path);
    } else if (key == "gamma") {
      gamma = number_or_auto(item, path);
    } else {
      detail::unknown_key(path);
    }
  }
  if (enabled && !*enabled) return;
  if (enabled) out.set_string("train.layer_drop", "progressive");
  if (!enabled) out.keep(name + ".enabled", "train.layer_drop");
  out.set_float_or_keep(name + ".theta", "train.layer_drop_theta", theta);
  out.set_float_or_keep(name + ".gamma", "train.layer_drop_gamma", gamma);
}

bool switched_on(const Json& section);

// data_efficiency: its data_routing's random-LTD for decoder models as train.random_ltd_*
// (DeepSpeed's switches default to off; the parts shardtrain lacks are refused by name).
void import_data_efficiency(const Json& value, Overrides& out) {
  const std::string name = "data_efficiency";
  const Json& section = detail::object_at(value, name);
  auto switch_at = [](const Json& part, const std::string& path) {
    return part.contains("enabled") && bool_or_auto(part.at("enabled"), path + ".enabled") == true;
  };
  for (const auto& [key, item] : section.items()) {
    const std::string path = name + "." + key;
    if (key == "data_sampling") {
      if (switch_at(section, name) && switched_on(item)) {
        throw std::invalid_argument("ds_config key '" + path +
                                    "': DeepSpeed's curriculum learning and data sampling "
                                    "are not available in shardtrain");
      }
    } else if (key == "seed") {
      int_or_auto(item, path);
      out.decide(path, "random-LTD draws from train.seed (each step, rank and forward its own)");
    } else if (key != "enabled" && key != "data_routing") {
      detail::unknown_key(path);
    }
  }
  if (!switch_at(section, name) || !section.contains("data_routing")) return;
  const std::string routing_name = name + ".data_routing";
  const Json& routing = detail::object_at(section.at("data_routing"), routing_name);
  for (const auto& [key, item] : routing.items()) {
    if (key != "enabled" && key != "random_ltd") detail::unknown_key(routing_name + "." + key);
  }
  if (!switch_at(routing, routing_name) || !routing.contains("random_ltd")) return;
  const std::string ltd_name = routing_name + ".random_ltd";
  const Json& ltd = detail::object_at(routing.at("random_ltd"), ltd_name);
  if (!switch_at(ltd, ltd_name)) return;
  std::vector<int64_t> ids;
  std::optional<int64_t> layer_num, total, min_value, max_value, require_steps, per_step;
  for (const auto& [key, item] : ltd.items()) {
    const std::string path = ltd_name + "." + key;
    if (key == "enabled" || key == "model_mask_name") {
      continue;  // the keyword DeepSpeed hands a model's attention mask under
    } else if (key == "total_layer_num") {
      total = int_or_auto(item, path);
    } else if (key == "random_ltd_layer_num") {
      layer_num = int_or_auto(item, path);
    } else if (key == "random_ltd_layer_id") {
      if (!item.is_array()) detail::bad_value(path, item, "expected a list of block numbers");
      for (const Json& id : item) {
        const auto number = int_or_auto(id, path);
        if (!number) detail::bad_value(path, item, "expected block numbers");
        ids.push_back(*number);
      }
    } else if (key == "model_type") {
      detail::require_value(item, path, "decoder",
                            "random-LTD for encoder (bidirectional) models is not available in "
                            "shardtrain, whose models are decoders");
    } else if (key == "hidden_state_order") {
      const std::string order = detail::string_at(item, path);
      if (order != "batch_seq_dim" && order != "seq_batch_dim") {
        detail::bad_value(path, item, "expected \"batch_seq_dim\" or \"seq_batch_dim\"");
      }
    } else if (key == "layer_token_lr_schedule") {
      if (switch_at(detail::object_at(item, path), path)) {
        throw std::invalid_argument("ds_config key '" + path +
                                    "': the learning rate by layer tokens is not available in "
                                    "shardtrain (nor implemented in DeepSpeed)");
      }
    } else if (key == "random_ltd_schedule") {
      for (const auto& [skey, sitem] : detail::object_at(item, path).items()) {
        const std::string spath = path + "." + skey;
        if (skey == "min_value") {
          min_value = int_or_auto(sitem, spath);
        } else if (skey == "max_value") {
          max_value = int_or_auto(sitem, spath);
        } else if (skey == "schedule_type") {
          detail::require_value(sitem, spath, "fixed_linear",
                                "the one schedule DeepSpeed runs is \"fixed_linear\"");
        } else if (skey == "schedule_config") {
          for (const auto& [ckey, citem] : detail::object_at(sitem, spath).items()) {
            if (ckey == "require_steps") {
              require_steps = int_or_auto(citem, spath + "." + ckey);
            } else if (ckey == "seq_per_step") {
              per_step = int_or_auto(citem, spath + "." + ckey);
            } else {
              detail::unknown_key(spath + "." + ckey);
            }
          }
        } else {
          detail::unknown_key(spath);
        }
      }
    } else {
      detail::unknown_key(path);
    }
  }
  if (ids.empty()) {
    throw std::invalid_argument("ds_config key '" + ltd_name +
                                "': enabled without random_ltd_layer_id (the blocks it drops "
                                "tokens in)");
  }
  if (layer_num && *layer_num != static_cast<int64_t>(ids.size())) {
    throw std::invalid_argument(
        "ds_config key '" + ltd_name + ".random_ltd_layer_num' = " + std::to_string(*layer_num) +
        " but random_ltd_layer_id lists " + std::to_string(ids.size()) + " blocks");
  }
  // DeepSpeed reads these without defaults (the sections on their paths are objects: checked
  // above).
  for (const char* key :
       {"total_layer_num", "random_ltd_schedule.min_value", "random_ltd_schedule.max_value",
        "random_ltd_schedule.schedule_config.require_steps",
        "random_ltd_schedule.schedule_config.seq_per_step"}) {
    std::string pointer = std::string("/") + key;
    std::replace(pointer.begin(), pointer.end(), '.', '/');
    if (!ltd.contains(Json::json_pointer(pointer))) {
      throw std::invalid_argument("ds_config key '" + ltd_name + "." + key +
                                  "' is missing: DeepSpeed's random-LTD needs it");
    }
  }
  out.set("train.random_ltd_layers", toml_ints(ids));
  const std::string schedule = ltd_name + ".random_ltd_schedule";
  out.set_int_or_keep(schedule + ".min_value", "train.random_ltd_min", min_value);
  out.set_int_or_keep(schedule + ".max_value", "train.random_ltd_max", max_value);
  out.set_int_or_keep(schedule + ".schedule_config.require_steps", "train.random_ltd_steps",
                      require_steps);
  out.set_int_or_keep(schedule + ".schedule_config.seq_per_step", "train.random_ltd_step",
                      per_step);
  out.set_int_or_keep(ltd_name + ".total_layer_num", "train.random_ltd_model_layers", total);
}

// Whether a feature's section does anything: its own "enabled" when it has one, else whether
// any of its parts is enabled (a section listing parts, each with a switch); a section
// without switches is on.
bool switched_on(const Json& section) {
  if (!section.is_object()) return true;
  if (section.contains("enabled")) return section.at("enabled") != false;
  bool any_switch = false;
  std::function<bool(const Json&)> any_on = [&](const Json& node) {
    if (!node.is_object()) return false;
    for (const auto& [key, value] : node.items()) {
      if (key == "enabled") {
        any_switch = true;
        if (value != false) return true;
      } else if (any_on(value)) {
        return true;
      }
    }
    return false;
  };
  return any_on(section) || !any_switch;
}

// Keys that only say how DeepSpeed logs or where it runs: accepted with any value.
bool logging_or_launch_key(const std::string& key) {
  static const std::set<std::string> keys = {"tensorboard",
                                             "wandb",
                                             "csv_monitor",
                                             "comet",
                                             "monitor_config",
                                             "comms_logger",
                                             "comms_config",
                                             "cuda_visible_devices",
                                             "zero_force_ds_cpu_optimizer",
                                             "memory_breakdown",
                                             "dump_state"};
  return keys.count(key) > 0 || (!key.empty() && key[0] == '_');  // "_comment" and the like
}

}  // namespace

std::vector<std::string> deepspeed_overrides_from_json(const std::string& json_text,
                                                       const std::string& source, int world_size,
                                                       std::vector<ImportNote>* notes) {
  detail::require_world_size(world_size);
  Json ds;
  try {
    ds = Json::parse(json_text);
  } catch (const Json::exception& e) {  // parse errors, and numbers that overflow a double
    throw std::invalid_argument(source + ": not valid JSON: " + e.what());
  }
  if (!ds.is_object()) throw std::invalid_argument(source + ": expected a JSON object");
  try {
    Overrides out;
    // train_batch_size counts data-parallel ranks: the world over AutoTP's tensor-parallel size.
    int data_parallel = world_size;
    if (ds.contains("tensor_parallel") && ds.at("tensor_parallel").is_object() &&
        ds.at("tensor_parallel").contains("autotp_size") &&
        ds.at("tensor_parallel").at("autotp_size").is_number_integer()) {
      const int tp = ds.at("tensor_parallel").at("autotp_size").get<int>();
      if (tp >= 1 && world_size % tp == 0) data_parallel = world_size / tp;
    }
    import_batch(ds, data_parallel, out);
    std::optional<double> optimizer_lr;
    bool fp32_grad_accum = false;
    for (const auto& [key, value] : ds.items()) {
      if (key == "train_batch_size" || key == "train_micro_batch_size_per_gpu" ||
          key == "gradient_accumulation_steps") {
        continue;  // import_batch
      } else if (key == "zero_optimization") {
        import_zero(value, world_size, out);
      } else if (key == "bf16" || key == "bfloat16") {
        const bool stage0 = !ds.contains("zero_optimization") ||
                            ds.at("zero_optimization").value("stage", Json(0)) == Json(0);
        import_bf16(value, stage0, out);
      } else if (key == "fp16") {
        import_fp16(value, out);
      } else if (key == "data_types") {
        fp32_grad_accum = import_data_types(value);
      } else if (key == "gradient_clipping") {
        out.set_float_or_keep(key, "train.clip", number_or_auto(value, key));
      } else if (key == "steps_per_print") {
        out.set_int_or_keep(key, "run.log_every", int_or_auto(value, key));
      } else if (key == "wall_clock_breakdown" || key == "zero_allow_untested_optimizer" ||
                 key == "prescale_gradients") {
        // Logging, a DeepSpeed-side safety check, and whether gradients are divided by the
        // ranks before or after they are summed: the same average.
        bool_or_auto(value, key);
      } else if (key == "gradient_predivide_factor") {
        number_or_auto(value, key);  // a split of the same division, before and after the sum
      } else if (key == "optimizer") {
        optimizer_lr = detail::import_ds_optimizer(value, out);
      } else if (key == "disable_allgather") {
        bool_or_auto(value, key);  // an older ZeRO-1 switch: the same parameters either way
      } else if (key == "activation_checkpointing") {
        // Settings of DeepSpeed's checkpointing API, which a model calls itself; they change
        // memory, not results. shardtrain's switch is train.activation_checkpointing.
        detail::object_at(value, key);
      } else if (key == "tensor_parallel") {
        import_tensor_parallel(value, out);
      } else if (key == "progressive_layer_drop") {
        import_layer_drop(value, out);
      } else if (key == "data_efficiency") {
        import_data_efficiency(value, out);
      } else if (key == "seq_parallel_communication_data_type" ||
                 key == "seq_parallel_comm_data_type") {
        detail::ulysses_dtype_note(detail::string_at(value, key), key, out);
      } else if (key == "autotuning") {
        const bool given = ds.contains("train_micro_batch_size_per_gpu") &&
                           !is_auto(ds.at("train_micro_batch_size_per_gpu"));
        std::optional<int64_t> total;
        if (ds.contains("train_batch_size")) {
          total = int_or_auto(ds.at("train_batch_size"), "train_batch_size");
        }
        detail::import_ds_autotuning(value, given, total, out);
      } else if (key == "compression_training") {
        // "auto" is the TOML's precision, which may be 16-bit.
        auto on = [&](const char* section) {
          if (!ds.contains(section) || !ds.at(section).is_object()) return false;
          const Json enabled = ds.at(section).value("enabled", Json(false));
          return enabled == Json(true) || is_auto(enabled);
        };
        detail::import_ds_compression(value, on("fp16") || on("bf16") || on("bfloat16"), out);
      } else if (logging_or_launch_key(key)) {
        continue;
      } else if (unavailable_features().count(key)) {
        if (switched_on(value)) {
          throw std::invalid_argument("ds_config key '" + key +
                                      "': " + unavailable_features().at(key) +
                                      " is not available in shardtrain");
        }
      } else if (key != "scheduler") {
        detail::unknown_key(key);
      }
    }
    if (!ds.contains("zero_optimization")) {
      out.set_string("parallel.strategy", "ddp");
      out.decide("zero_optimization", "absent: stage 0, plain data parallelism (DeepSpeed's)");
    }
    if (ds.contains("scheduler")) {
      detail::import_ds_scheduler(ds.at("scheduler"), optimizer_lr, out);
    } else if (ds.contains("optimizer")) {
      // DeepSpeed without a scheduler keeps the optimizer's learning rate throughout.
      out.set_string("train.schedule", "constant");
      out.set_int("train.warmup", 0);
      out.decide("scheduler", "absent: a constant learning rate without warmup (DeepSpeed's)");
    } else {
      out.keep("scheduler", "train.schedule");
    }
    // Set after the bf16 section, whose reduction dtype it replaces.
    if (fp32_grad_accum) out.set_string("precision.reduce_dtype", "fp32");
    auto enabled = [&](const char* key) {
      return ds.contains(key) && ds.at(key).contains("enabled") && ds.at(key).at("enabled") == true;
    };
    if (enabled("bf16") && enabled("fp16")) {
      throw std::invalid_argument("ds_config: bf16.enabled and fp16.enabled cannot both be true");
    }
    if (notes) *notes = out.notes();
    return out.list();
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(source + ": " + e.what());
  }
}

std::vector<std::string> deepspeed_overrides(const std::string& path, int world_size,
                                             std::vector<ImportNote>* notes) {
  return deepspeed_overrides_from_json(detail::read_config_file(path, "DeepSpeed config"), path,
                                       world_size, notes);
}

}  // namespace shardtrain
