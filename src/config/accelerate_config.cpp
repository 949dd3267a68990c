// accelerate's config YAML (`accelerate config` writes it) as TrainConfig overrides: FSDP,
// DeepSpeed (its deepspeed_config block) and plain data parallel (MULTI_GPU / MULTI_CPU).
// Keys that only say how accelerate launches (IPs, machine ranks, TPU settings) do not change what
// is trained and are accepted with any value; the rest map onto parallel.fsdp.* and precision.*
// or are an error naming them.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
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
  static const std::set<std::string> keys = {
      "compute_environment", "machine_rank", "main_training_function", "num_machines",
      "rdzv_backend", "same_network", "tpu_env", "tpu_use_cluster", "tpu_use_sudo", "use_cpu",
      "downcast_bf16", "debug", "gpu_ids", "main_process_ip", "main_process_port",
      "enable_cpu_affinity", "tpu_name", "tpu_zone", "command_file", "commands", "mpirun_config",
      // Amazon SageMaker's job settings
      "ec2_instance_type", "iam_role_name", "profile", "region", "base_job_name",
      "num_machines_per_node", "sagemaker_inputs_file", "sagemaker_metrics_file", "additional_args",
      "pytorch_version", "transformers_version", "py_version"};
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
      // FSDP2 shards each parameter, FSDP1 flat groups of them; shardtrain's FSDP computes the
      // same steps either way (docs/fsdp.md).
      const int64_t version = integer(node, key);
      if (version != 1 && version != 2) bad_value(key, scalar(node, key), "expected 1 or 2");
    } else if (name == "fsdp_reshard_after_forward") {
      // FSDP2's spelling of the sharding strategy: true frees the gathered parameters after
      // forward (FULL_SHARD), false keeps them for backward (SHARD_GRAD_OP). Newer files may
      // name the strategy itself.
      const std::string value = scalar(node, key);
      if (value == "true" || value == "True") {
        out.set_string("parallel.fsdp.sharding", "full_shard");
      } else if (value == "false" || value == "False") {
        out.set_string("parallel.fsdp.sharding", "shard_grad_op");
      } else {
        out.set_string("parallel.fsdp.sharding", sharding_name(value, key));
      }
    } else if (name == "fsdp_ignored_modules") {
      if (!node.IsNull()) {
        throw std::invalid_argument("accelerate config key '" + key +
                                    "': modules left out of FSDP are not supported (every "
                                    "parameter is sharded)");
      }
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
      // accelerate then wraps the model's own block class (its _no_split_modules).
      out.set_string("parallel.fsdp.wrap", "block");
      out.decide("fsdp_config.fsdp_transformer_layer_cls_to_wrap",
                 "absent: the model's own block class, as accelerate does");
      return;
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
void import_deepspeed(const YAML::Node& node, const std::string& source, int world_size,
                      Overrides& out) {
  if (!node.IsMap())
    throw std::invalid_argument("accelerate config key 'deepspeed_config': expected a mapping");
  if (node["deepspeed_config_file"]) {
    // The ds_config.json says everything; accelerate reads nothing else from this block but
    // its launcher settings.
    std::string path = scalar(node["deepspeed_config_file"], "deepspeed_config_file");
    // accelerate reads the path from the working directory; one that is not there is looked
    // for beside the YAML file, where a repository's relative paths lead.
    const std::filesystem::path beside = std::filesystem::path(source).parent_path() / path;
    if (!std::filesystem::exists(path) && std::filesystem::path(path).is_relative() &&
        std::filesystem::exists(beside)) {
      path = beside.string();
    }
    std::vector<ImportNote> notes;
    for (const auto& line : deepspeed_overrides(path, world_size, &notes)) out.set_line(line);
    out.add_notes(notes);
    for (const auto& item : node) {
      const std::string key = item.first.as<std::string>();
      if (key != "deepspeed_config_file" && key != "zero3_init_flag" &&
          key != "deepspeed_multinode_launcher" && key != "deepspeed_hostfile" &&
          key != "deepspeed_exclusion_filter" && key != "deepspeed_inclusion_filter") {
        bad_value("deepspeed_config." + key, scalar(item.second, key),
                  "comes from deepspeed_config_file '" + path + "' when one is given");
      }
    }
    return;
  }
  out.set_string("parallel.strategy", "zero");
  if (!node["zero_stage"]) {
    out.set_int("parallel.zero.stage", 2);
    out.decide("deepspeed_config.zero_stage", "absent: accelerate's default stage 2");
  }
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
    } else if (key == "seq_parallel_communication_data_type" ||
               key == "seq_parallel_comm_data_type") {
      ulysses_dtype_note(scalar(value, name), name, out);
    } else if (key == "sequence_parallel_size") {
      // DeepSpeed-Ulysses' sequence-parallel ranks: context parallelism's ring attention
      // computes the same attention over the same split.
      const int64_t size = integer(value, name);
      if (size < 1) bad_value(name, scalar(value, name), "must be at least 1");
      if (size > 1) out.set_int("parallel.cp", size);
    } else if (key == "zero3_init_flag" || key == "zero3_save_16bit_model" ||
               key == "deepspeed_multinode_launcher" || key == "deepspeed_hostfile" ||
               key == "deepspeed_exclusion_filter" || key == "deepspeed_inclusion_filter") {
      // Construction and saving details of DeepSpeed's own, and how its launcher reaches other
      // nodes: nothing to set here.
    } else {
      unknown_key(name);
    }
  }
}

// accelerate's ND-parallel sizes (FSDP2): tensor and context parallelism inside, replicas of
// the FSDP shards across (hybrid sharding); every size 1 otherwise.
void import_parallelism(const YAML::Node& node, const std::string& type, int world_size,
                        Overrides& out) {
  if (!node.IsMap())
    throw std::invalid_argument("accelerate config key 'parallelism_config': expected a mapping");
  std::map<std::string, int64_t> size = {
      {"dp_replicate", 1}, {"dp_shard", 0}, {"tp", 1}, {"cp", 1}, {"sp", 1}};
  for (const auto& item : node) {
    const std::string key = item.first.as<std::string>();
    const std::string name = "parallelism_config." + key;
    // DeepSpeed-Ulysses' settings beside its size: which implementation splits the sequences
    // (parallel.cp's ring attention here), and how the model's attention runs.
    if (key == "parallelism_config_sp_backend" ||
        key == "parallelism_config_sp_seq_length_is_variable" ||
        key == "parallelism_config_sp_attn_implementation") {
      continue;
    }
    const std::string prefix = "parallelism_config_";
    const std::string axis = key.rfind(prefix, 0) == 0 && key.size() > prefix.size() + 5
                                 ? key.substr(prefix.size(), key.size() - prefix.size() - 5)
                                 : "";
    if (!size.count(axis) || key.substr(key.size() - 5) != "_size") unknown_key(name);
    size[axis] = integer(item.second, name);
    if (size[axis] < 1) bad_value(name, scalar(item.second, name), "must be at least 1");
  }
  if (size["sp"] > 1) {
    if (size["cp"] > 1) {
      throw std::invalid_argument(
          "accelerate config: parallelism_config_sp_size and parallelism_config_cp_size both "
          "split sequences; give one");
    }
    // Ulysses' sequence parallelism as context parallelism: the same attention over the same
    // split, its all-to-alls replaced by ring attention's exchanges.
    size["cp"] = size["sp"];
    out.decide("parallelism_config.parallelism_config_sp_size",
               std::to_string(size["sp"]) + ": parallel.cp = " + std::to_string(size["sp"]) +
                   " (ring attention in place of DeepSpeed-Ulysses' all-to-all)");
  }
  const int64_t inner = size["dp_replicate"] * size["tp"] * size["cp"];
  if (size["dp_shard"] == 0) size["dp_shard"] = world_size / inner;
  if (inner * size["dp_shard"] != world_size) {
    throw std::invalid_argument(
        "accelerate config: parallelism_config's sizes (dp_replicate " +
        std::to_string(size["dp_replicate"]) + " x dp_shard " + std::to_string(size["dp_shard"]) +
        " x tp " + std::to_string(size["tp"]) + " x cp " + std::to_string(size["cp"]) +
        ") do not make the launch's " + std::to_string(world_size) + " rank(s)");
  }
  if (inner == 1) return;
  if (type == "DEEPSPEED" && inner == size["cp"]) {
    out.set_int("parallel.cp", size["cp"]);  // ZeRO over the rest
    return;
  }
  if (type != "FSDP") {
    throw std::invalid_argument("accelerate config: parallelism_config with distributed_type " +
                                type + " is not supported (FSDP's is)");
  }
  if (size["tp"] > 1) out.set_int("parallel.tp", size["tp"]);
  if (size["cp"] > 1) out.set_int("parallel.cp", size["cp"]);
  if (size["dp_replicate"] > 1) {
    out.set_string("parallel.fsdp.sharding", "hybrid_shard");
    out.set_int("parallel.fsdp.replicate", size["dp_replicate"]);
  }
}

// `bf16_weights`: FSDP, whose bf16 policy accelerate sets, and DeepSpeed at stage 1-3, whose
// bf16 section accelerate writes from mixed_precision (the same as --deepspeed's bf16).
void import_mixed_precision(const std::string& value, bool bf16_weights, Overrides& out) {
  if (value == "no") return;
  if (value == "bf16" && !bf16_weights) {
    out.set_string("precision.autocast", "bf16");  // DDP: autocast over fp32 weights
  } else if (value == "bf16") {
    // Computes, reduces and keeps buffers in bf16, with fp32 master weights in the optimizer.
    out.set_string("precision.param_dtype", "bf16");
    out.set_string("precision.reduce_dtype", "bf16");
    out.set_string("precision.buffer_dtype", "bf16");
  } else if (value == "fp16") {
    out.set_string("precision.autocast", "fp16");
    out.set_string("precision.loss_scale", "dynamic");
  } else if (value == "fp8") {
    // accelerate runs fp8 layers under bf16 autocast; the recipe is fp8_config's.
    out.set_string("precision.autocast", "bf16");
  } else {
    bad_value("mixed_precision", value, "expected no, bf16 or fp16");
  }
}

// fp8_config (with mixed_precision: fp8; `given` false: absent): Transformer Engine's delayed
// scaling as precision.fp8, with accelerate's defaults (TERecipeKwargs: HYBRID, a history of
// 1024, most_recent, margin 0, interval 1).
void import_fp8_config(const YAML::Node* given, Overrides& out) {
  std::string format = "HYBRID", algo = "most_recent";
  int64_t history = 1024, margin = 0;
  if (given) {
    if (!given->IsMap()) bad_value("fp8_config", "...", "expected a mapping");
    for (const auto& item : *given) {
      const std::string key = "fp8_config." + item.first.as<std::string>();
      const YAML::Node& node = item.second;
      const std::string name = item.first.as<std::string>();
      if (name == "backend") {
        const std::string backend = scalar(node, key);
        if (backend != "TE" && backend != "te") {
          bad_value(key, backend,
                    "only Transformer Engine's delayed scaling (TE) is available in shardtrain; "
                    "MS-AMP and torchao are not");
        }
      } else if (name == "fp8_format") {
        format = scalar(node, key);
        for (char& c : format) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
        if (format != "HYBRID" && format != "E4M3") {
          bad_value(key, format, "expected HYBRID or E4M3");
        }
      } else if (name == "amax_history_len" || name == "amax_history_length") {
        // `accelerate config` writes the longer spellings.
        history = integer(node, key);
      } else if (name == "amax_compute_algo" || name == "amax_compute_algorithm") {
        algo = scalar(node, key);
        for (char& c : algo) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      } else if (name == "margin") {
        margin = integer(node, key);
      } else if (name == "interval") {
        if (integer(node, key) != 1) {
          bad_value(key, scalar(node, key), "the scales are updated after every step (1)");
        }
      } else if (name == "override_linear_precision") {
        // Three switches (forward, input gradient, weight gradient in higher precision), as a
        // list or as accelerate writes a tuple: "(false, false, false)".
        std::string text;
        if (node.IsSequence()) {
          for (const auto& flag : node) text += flag.as<std::string>() + ",";
        } else {
          text = scalar(node, key);
        }
        for (const std::string word : {"true", "True"}) {
          if (text.find(word) != std::string::npos) {
            bad_value(key, text, "every fp8 product runs in fp8 here: (false, false, false)");
          }
        }
      } else if (name == "use_autocast_during_eval") {
        if (boolean(node, key)) {
          bad_value(key, scalar(node, key),
                    "evaluation runs in the training's higher precision here (false)");
        }
      } else if (name == "opt_level") {
        bad_value(key, scalar(node, key), "an MS-AMP setting; MS-AMP is not available");
      } else {
        unknown_key(key);
      }
    }
  }
  out.set_string("precision.fp8", format == "E4M3" ? "e4m3" : "hybrid");
  out.set_int("precision.fp8_amax_history", history);
  out.set_string("precision.fp8_amax_algo", algo);
  out.set_int("precision.fp8_margin", margin);
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
    } else if (type == "MULTI_GPU" || type == "MULTI_CPU" || type == "MULTI_XPU" ||
               type == "MULTI_NPU" || type == "MULTI_MLU" || type == "MULTI_MUSA") {
      // Plain data parallelism on whichever devices: the same steps.
      out.set_string("parallel.strategy", "ddp");
    } else if (type == "NO") {
      // One process: accelerate runs the model as it is.
      if (world_size != 1) {
        bad_value(
            "distributed_type", type,
            "runs one process, and the launch has " + std::to_string(world_size) + " rank(s)");
      }
      out.set_string("parallel.strategy", "none");
    } else if (type != "DEEPSPEED") {
      bad_value("distributed_type", type,
                "expected FSDP, DEEPSPEED, MULTI_GPU, MULTI_CPU, MULTI_XPU or NO (MEGATRON_LM's "
                "plugin is not imported: set parallel.tp in the TOML for tensor parallelism)");
    }
    if (type == "DEEPSPEED" && !doc["deepspeed_config"]) {
      throw std::invalid_argument(
          "accelerate config with distributed_type DEEPSPEED has no 'deepspeed_config' (or pass "
          "the ds_config.json itself with --deepspeed)");
    }
    std::optional<YAML::Node> parallelism, fp8_config;
    for (const auto& item : doc) {
      const std::string key = item.first.as<std::string>();
      const YAML::Node& node = item.second;
      if (key == "distributed_type" || launch_keys().count(key)) {
        continue;
      } else if (key == "fsdp_config" && type == "FSDP") {
        import_fsdp(node, out);
      } else if (key == "deepspeed_config" && type == "DEEPSPEED") {
        import_deepspeed(node, source, world_size, out);
      } else if ((key == "fsdp_config" || key == "deepspeed_config" ||
                  key == "megatron_lm_config") &&
                 node.IsMap()) {
        // accelerate reads only the section of its distributed_type; `accelerate config`
        // writes empty ones for the others.
        if (node.size() > 0)
          out.decide(key, "ignored, as accelerate does: distributed_type is " + type);
      } else if (key == "parallelism_config") {
        parallelism = node;  // after fsdp_config, whose sharding it may make hybrid
      } else if (key == "mixed_precision") {
        const bool stage0 = type == "DEEPSPEED" && doc["deepspeed_config"] &&
                            doc["deepspeed_config"]["zero_stage"] &&
                            scalar(doc["deepspeed_config"]["zero_stage"], "zero_stage") == "0";
        import_mixed_precision(scalar(node, key),
                               type == "FSDP" || (type == "DEEPSPEED" && !stage0), out);
      } else if (key == "num_processes") {
        const int64_t n = integer(node, key);
        if (n != world_size && type != "NO") {  // NO runs one process whatever the count
          bad_value(key, scalar(node, key),
                    "the launch has " + std::to_string(world_size) + " rank(s) (WORLD_SIZE)");
        }
      } else if (key == "dynamo_backend") {
        if (scalar(node, key) != "NO" && scalar(node, key) != "no")
          bad_value(key, scalar(node, key), "torch.compile backends are not supported (NO)");
      } else if (key == "dynamo_config") {
        const bool off = node.IsMap() && node["dynamo_backend"] &&
                         scalar(node["dynamo_backend"], "dynamo_config.dynamo_backend") == "NO";
        if (!off)
          bad_value(key, "...", "torch.compile backends are not supported (dynamo_backend: NO)");
      } else if (key == "fp8_config") {
        fp8_config = node;  // read with mixed_precision, after the loop
      } else {
        unknown_key(key);
      }
    }
    if (parallelism) import_parallelism(*parallelism, type, world_size, out);
    const bool fp8 = doc["mixed_precision"] && doc["mixed_precision"].IsScalar() &&
                     doc["mixed_precision"].Scalar() == "fp8";
    if (fp8) {
      import_fp8_config(fp8_config ? &*fp8_config : nullptr, out);
    } else if (fp8_config) {
      out.decide("fp8_config", "ignored, as accelerate does: mixed_precision is not fp8");
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
