// accelerate's config YAML (`accelerate config` writes it) as TrainConfig overrides: FSDP,
// DeepSpeed (its deepspeed_config block) and plain data parallel (MULTI_GPU / MULTI_CPU).
// Keys that only say how accelerate launches (IPs, machine ranks, TPU settings) do not change what
// is trained and are accepted with any value; the rest map onto parallel.fsdp.* and precision.*
// or are an error naming them.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <optional>
#include <set>

#include "config/import_common.h"
#include "shardtrain/config.h"

namespace shardtrain {
namespace {

using detail::Overrides;

[[noreturn]] void bad_value(const std::string& key, const std::string& value,
                            const std::string& why) {
  throw std::invalid_argument("accelerate config key '" + key + "' = '" + value + "': " + why);
}

[[noreturn]] void unknown_key(const std::string& key) {
  throw std::invalid_argument("accelerate config key '" + key +
                              "' is not supported (see docs/deepspeed.md for the keys shardtrain "
                              "reads)");
}

std::string scalar(const YAML::Node& node, const std::string& key) {
  if (!node.IsScalar()) {
    throw std::invalid_argument("accelerate config key '" + key + "': expected a single value");
  }
  return node.Scalar();
}

bool boolean(const YAML::Node& node, const std::string& key) {
  const std::string text = scalar(node, key);
  if (text == "true" || text == "True") return true;
  if (text == "false" || text == "False") return false;
  bad_value(key, text, "expected true or false");
}

int64_t integer(const YAML::Node& node, const std::string& key) {
  const std::string text = scalar(node, key);
  try {
    size_t used = 0;
    const long long value = std::stoll(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  bad_value(key, text, "expected an integer");
}

// Launch-side keys: where and how accelerate starts processes, not what they train.
const std::set<std::string>& launch_keys() {
  static const std::set<std::string> keys = {"compute_environment",
                                             "machine_rank",
                                             "main_training_function",
                                             "num_machines",
                                             "rdzv_backend",
                                             "same_network",
                                             "tpu_env",
                                             "tpu_use_cluster",
                                             "tpu_use_sudo",
                                             "use_cpu",
                                             "downcast_bf16",
                                             "debug",
                                             "gpu_ids",
                                             "main_process_ip",
                                             "main_process_port",
                                             "enable_cpu_affinity",
                                             "tpu_name",
                                             "tpu_zone",
                                             "command_file",
                                             "commands"};
  return keys;
}

std::string sharding_name(const std::string& value, const std::string& key) {
  static const std::vector<std::pair<std::string, std::string>> names = {
      {"FULL_SHARD", "full_shard"},
      {"SHARD_GRAD_OP", "shard_grad_op"},
      {"NO_SHARD", "no_shard"},
      {"HYBRID_SHARD", "hybrid_shard"}};
  // Newer accelerate writes the enum's number, 1-based, in the same order.
  if (value.size() == 1 && value[0] >= '1' && value[0] <= '4') return names[value[0] - '1'].second;
  for (const auto& [upper, ours] : names) {
    if (value == upper) return ours;
  }
  if (value == "5" || value == "HYBRID_SHARD_ZERO2" || value == "_HYBRID_SHARD_ZERO2") {
    bad_value(key, value,
              "HYBRID_SHARD_ZERO2 is not supported (use HYBRID_SHARD or SHARD_GRAD_OP)");
  }
  bad_value(key, value, "expected FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD or 1-4");
}

// Splits "GPT2Block, LlamaDecoderLayer" into class names.
std::string class_list(const std::string& text) {
  std::string array = "[";
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string name = text.substr(start, end - start);
    name.erase(0, name.find_first_not_of(" \t"));
    name.erase(name.find_last_not_of(" \t") + 1);
    if (!name.empty()) array += (array.size() > 1 ? ", " : "") + detail::toml_string(name);
    start = end + 1;
  }
  return array + "]";
}

void import_fsdp(const YAML::Node& section, Overrides& out) {
  if (!section.IsMap())
    throw std::invalid_argument("accelerate config key 'fsdp_config': expected a mapping");
  std::string wrap_policy;
  std::string classes;
  std::optional<int64_t> min_params;
  for (const auto& item : section) {
    const std::string name = item.first.as<std::string>();
    const std::string key = "fsdp_config." + name;
    const YAML::Node& node = item.second;
    if (name == "fsdp_sharding_strategy") {
      out.set_string("parallel.fsdp.sharding", sharding_name(scalar(node, key), key));
    } else if (name == "fsdp_auto_wrap_policy") {
      wrap_policy = scalar(node, key);
    } else if (name == "fsdp_transformer_layer_cls_to_wrap") {
      classes = node.IsSequence() ? "" : scalar(node, key);
      if (node.IsSequence()) {
        for (const auto& c : node) classes += (classes.empty() ? "" : ",") + c.as<std::string>();
      }
    } else if (name == "fsdp_min_num_params") {
      min_params = integer(node, key);
    } else if (name == "fsdp_backward_prefetch" || name == "fsdp_backward_prefetch_policy") {
      const std::string value = scalar(node, key);
      if (value == "BACKWARD_PRE") {
        out.set_string("parallel.fsdp.prefetch", "backward_pre");
      } else if (value == "BACKWARD_POST") {
        out.set_string("parallel.fsdp.prefetch", "backward_post");
      } else if (value == "NO_PREFETCH") {
        out.set_string("parallel.fsdp.prefetch", "none");
      } else {
        bad_value(key, value, "expected BACKWARD_PRE, BACKWARD_POST or NO_PREFETCH");
      }
    } else if (name == "fsdp_forward_prefetch") {
      out.set_bool("parallel.fsdp.forward_prefetch", boolean(node, key));
    } else if (name == "fsdp_offload_params") {
      out.set_bool("parallel.fsdp.cpu_offload", boolean(node, key));
    } else if (name == "fsdp_activation_checkpointing") {
      out.set_bool("train.activation_checkpointing", boolean(node, key));
    } else if (name == "fsdp_state_dict_type") {
      const std::string value = scalar(node, key);
      if (value != "FULL_STATE_DICT" && value != "SHARDED_STATE_DICT") {
        bad_value(key, value,
                  "expected FULL_STATE_DICT or SHARDED_STATE_DICT (a LOCAL_STATE_DICT checkpoint "
                  "only loads at the world size that wrote it; shardtrain's checkpoints load at "
                  "any)");
      }
    } else if (name == "fsdp_version") {
      if (integer(node, key) != 1)
        bad_value(key, scalar(node, key), "only FSDP version 1 is supported");
    } else if (name == "fsdp_use_orig_params" || name == "fsdp_sync_module_states" ||
               name == "fsdp_cpu_ram_efficient_loading") {
      // The optimizer steps on flat shards either way, and every rank builds the same initial
      // weights from the seed: these change nothing shardtrain computes.
      boolean(node, key);
    } else {
      unknown_key(key);
    }
  }
  if (wrap_policy.empty() && (!classes.empty() || min_params)) {
    throw std::invalid_argument(
        "accelerate config: fsdp_transformer_layer_cls_to_wrap / fsdp_min_num_params need "
        "fsdp_config.fsdp_auto_wrap_policy");
  }
  if (wrap_policy == "TRANSFORMER_BASED_WRAP") {
    if (classes.empty()) {
      throw std::invalid_argument(
          "accelerate config: fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP needs "
          "fsdp_config.fsdp_transformer_layer_cls_to_wrap");
    }
    out.set_string("parallel.fsdp.wrap", "class");
    out.set("parallel.fsdp.wrap_classes", class_list(classes));
  } else if (wrap_policy == "SIZE_BASED_WRAP") {
    out.set_string("parallel.fsdp.wrap", "size");
    if (min_params) out.set_int("parallel.fsdp.min_params", *min_params);
  } else if (!wrap_policy.empty()) {
    bad_value("fsdp_config.fsdp_auto_wrap_policy", wrap_policy,
              wrap_policy == "NO_WRAP"
                  ? "NO_WRAP is not supported: FSDP needs units (use TRANSFORMER_BASED_WRAP)"
                  : "expected TRANSFORMER_BASED_WRAP or SIZE_BASED_WRAP");
  }
}

// accelerate's deepspeed_config block (what `accelerate config` writes for DeepSpeed without a
// ds_config.json file): the ZeRO stage, offload devices, accumulation and clipping.
void import_deepspeed(const YAML::Node& node, Overrides& out) {
  if (!node.IsMap())
    throw std::invalid_argument("accelerate config key 'deepspeed_config': expected a mapping");
  out.set_string("parallel.strategy", "zero");
  for (const auto& item : node) {
    const std::string key = item.first.as<std::string>();
    const std::string name = "deepspeed_config." + key;
    const YAML::Node& value = item.second;
    if (key == "zero_stage") {
      const int64_t stage = integer(value, name);
      if (stage < 1 || stage > 3) bad_value(name, scalar(value, name), "expected 1, 2 or 3");
      out.set_int("parallel.zero.stage", stage);
    } else if (key == "offload_optimizer_device" || key == "offload_param_device") {
      const std::string device = scalar(value, name);
      if (device != "none" && device != "cpu" && device != "nvme") {
        bad_value(name, device, "expected none, cpu or nvme");
      }
      out.set_string(key == "offload_optimizer_device" ? "parallel.zero.offload_optimizer"
                                                       : "parallel.zero.offload_param",
                     device);
    } else if (key == "offload_optimizer_nvme_path" || key == "offload_param_nvme_path") {
      const std::string path = scalar(value, name);
      if (path != "none") out.set_string("parallel.zero.nvme_path", path);
    } else if (key == "gradient_accumulation_steps") {
      out.set_int("train.grad_accum", integer(value, name));
    } else if (key == "gradient_clipping") {
      out.set_float("train.clip", std::stod(scalar(value, name)));
    } else if (key == "zero3_init_flag" || key == "zero3_save_16bit_model") {
      // Construction and saving details of DeepSpeed's own: nothing to set here.
    } else {
      unknown_key(name);
    }
  }
}

void import_mixed_precision(const std::string& value, bool fsdp, Overrides& out) {
  if (value == "no") return;
  if (value == "bf16" && !fsdp) {
    out.set_string("precision.autocast", "bf16");  // DDP and DeepSpeed: autocast, fp32 weights
  } else if (value == "bf16") {
    // accelerate's FSDP policy for bf16 computes, reduces and keeps buffers in bf16, with fp32
    // master weights in the optimizer.
    out.set_string("precision.param_dtype", "bf16");
    out.set_string("precision.reduce_dtype", "bf16");
    out.set_string("precision.buffer_dtype", "bf16");
  } else if (value == "fp16") {
    out.set_string("precision.autocast", "fp16");
    out.set_string("precision.loss_scale", "dynamic");
  } else {
    bad_value("mixed_precision", value, "expected no, bf16 or fp16");
  }
}

}  // namespace

std::vector<std::string> accelerate_overrides_from_yaml(const std::string& yaml_text,
                                                        const std::string& source, int world_size,
                                                        std::vector<ImportNote>* notes) {
  detail::require_world_size(world_size);
  YAML::Node doc;
  try {
    doc = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw std::invalid_argument(source + ": not valid YAML: " + e.what());
  }
  if (!doc.IsMap()) throw std::invalid_argument(source + ": expected a YAML mapping");
  try {
    Overrides out;
    if (!doc["distributed_type"]) {
      throw std::invalid_argument(
          "accelerate config key 'distributed_type' is missing (FSDP, DEEPSPEED, MULTI_GPU "
          "or MULTI_CPU expected)");
    }
    const std::string type = scalar(doc["distributed_type"], "distributed_type");
    if (type == "FSDP") {
      out.set_string("parallel.strategy", "fsdp");
    } else if (type == "MULTI_GPU" || type == "MULTI_CPU") {
      out.set_string("parallel.strategy", "ddp");
    } else if (type != "DEEPSPEED") {
      bad_value("distributed_type", type,
                "expected FSDP, DEEPSPEED, MULTI_GPU or MULTI_CPU (MEGATRON_LM's plugin is not "
                "imported: set parallel.tp in the TOML for tensor parallelism)");
    }
    if (type == "DEEPSPEED" && !doc["deepspeed_config"]) {
      throw std::invalid_argument(
          "accelerate config with distributed_type DEEPSPEED has no 'deepspeed_config' (or pass "
          "the ds_config.json itself with --deepspeed)");
    }
    for (const auto& item : doc) {
      const std::string key = item.first.as<std::string>();
      const YAML::Node& node = item.second;
      if (key == "distributed_type" || launch_keys().count(key)) {
        continue;
      } else if (key == "fsdp_config" && type == "FSDP") {
        import_fsdp(node, out);
      } else if (key == "deepspeed_config" && type == "DEEPSPEED") {
        import_deepspeed(node, out);
      } else if (key == "mixed_precision") {
        import_mixed_precision(scalar(node, key), type == "FSDP", out);
      } else if (key == "num_processes") {
        const int64_t n = integer(node, key);
        if (n != world_size) {
          bad_value(key, scalar(node, key),
                    "the launch has " + std::to_string(world_size) + " rank(s) (WORLD_SIZE)");
        }
      } else if (key == "dynamo_config") {
        const bool off = node.IsMap() && node["dynamo_backend"] &&
                         scalar(node["dynamo_backend"], "dynamo_config.dynamo_backend") == "NO";
        if (!off)
          bad_value(key, "...", "torch.compile backends are not supported (dynamo_backend: NO)");
      } else {
        unknown_key(key);
      }
    }
    if (notes) *notes = out.notes();
    return out.list();
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(source + ": " + e.what());
  }
}

std::vector<std::string> accelerate_overrides(const std::string& path, int world_size,
                                              std::vector<ImportNote>* notes) {
  return accelerate_overrides_from_yaml(detail::read_config_file(path, "accelerate config"), path,
                                        world_size, notes);
}

}  // namespace shardtrain
