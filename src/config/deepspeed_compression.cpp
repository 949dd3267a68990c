// ds_config's compression_training: weight and activation quantization as [compression]; the
// pruning techniques and layer reduction are refused when enabled.
#include <string>
#include <vector>

#include "config/deepspeed_json.h"

namespace shardtrain::detail {
namespace {

// A technique's "different_groups": each group's bits (read by `bits_of`) and module patterns.
struct Groups {
  std::vector<int64_t> bits;
  std::vector<std::vector<std::string>> modules;
};

template <typename BitsOf>
Groups read_groups(const Json& section, const std::string& path, BitsOf bits_of) {
  Groups groups;
  if (!section.contains("different_groups")) bad_value(path, section, "has no different_groups");
  const std::string groups_path = path + ".different_groups";
  for (const auto& [name, group] : object_at(section.at("different_groups"), groups_path).items()) {
    const std::string group_path = groups_path + "." + name;
    object_at(group, group_path);
    Json params = Json::object();
    std::vector<std::string> modules;
    for (const auto& [key, value] : group.items()) {
      if (key == "params") {
        params = object_at(value, group_path + ".params");
      } else if (key == "modules") {
        if (!value.is_array() || value.empty()) {
          bad_value(group_path + ".modules", value, "expected a list of module name patterns");
        }
        for (const auto& item : value) modules.push_back(string_at(item, group_path + ".modules"));
      } else if (key == "related_modules") {
        // Pruning's related layers: quantization has none.
      } else {
        unknown_key(group_path + "." + key);
      }
    }
    if (modules.empty()) {
      // DeepSpeed's default "*" (every module) is not a regular expression here.
      bad_value(group_path, group, "name its layers in \"modules\"");
    }
    groups.bits.push_back(bits_of(params, group_path + ".params"));
    groups.modules.push_back(std::move(modules));
  }
  return groups;
}

std::string toml_groups(const std::vector<std::vector<std::string>>& groups) {
  std::string text = "[";
  for (size_t g = 0; g < groups.size(); ++g) {
    text += g ? ", [" : "[";
    for (size_t i = 0; i < groups[g].size(); ++i) {
      text += (i ? ", " : "") + toml_string(groups[g][i]);
    }
    text += "]";
  }
  return text + "]";
}

int64_t bits_at(const Json& params, const std::string& path, const char* key) {
  if (!params.contains(key)) bad_value(path, params, std::string("has no ") + key);
  const auto bits = int_or_auto(params.at(key), path + "." + key);
  if (!bits) bad_value(path + "." + key, params.at(key), "expected a number of bits");
  return *bits;
}

// A technique's "shared_parameters" (empty when absent); its only other key is
// "different_groups" (read_groups).
Json shared_parameters(const Json& section, const std::string& path) {
  object_at(section, path);
  for (const auto& [key, value] : section.items()) {
    if (key != "shared_parameters" && key != "different_groups") unknown_key(path + "." + key);
  }
  return section.contains("shared_parameters")
             ? object_at(section.at("shared_parameters"), path + ".shared_parameters")
             : Json::object();
}

std::string quantization_type(const Json& value, const std::string& path) {
  const std::string type = string_at(value, path);
  if (type != "symmetric" && type != "asymmetric") {
    bad_value(path, value, "expected \"symmetric\" or \"asymmetric\"");
  }
  return type;
}

void import_weight_quantization(const Json& section, bool sixteen_bit, Overrides& out) {
  const std::string path = "compression_training.weight_quantization";
  const Json shared = shared_parameters(section, path);
  const std::string shared_path = path + ".shared_parameters";
  bool enabled = false, in_forward = false, mixed = false;
  int64_t groups = 1, offset = 0;
  std::string type = "symmetric", rounding = "nearest";
  for (const auto& [key, value] : shared.items()) {
    const std::string key_path = shared_path + "." + key;
    if (key == "enabled") {
      enabled = bool_or_auto(value, key_path).value_or(false);
    } else if (key == "quantize_weight_in_forward") {
      in_forward = bool_or_auto(value, key_path).value_or(false);
    } else if (key == "quantize_groups") {
      groups = int_or_auto(value, key_path).value_or(1);
    } else if (key == "schedule_offset") {
      offset = int_or_auto(value, key_path).value_or(0);
    } else if (key == "quantization_type") {
      type = quantization_type(value, key_path);
    } else if (key == "rounding") {
      rounding = string_at(value, key_path);
    } else if (key == "fp16_mixed_quantize") {
      const Json& mix = object_at(value, key_path);
      mixed = mix.contains("enabled") && mix.at("enabled") == true;
    } else if (key == "quantizer_kernel" || key == "quantize_verbose") {
      bool_or_auto(value, key_path);  // a CUDA kernel of the same rounding; logging
    } else {
      unknown_key(key_path);
    }
  }
  if (!enabled) return;
  // Without quantize_weight_in_forward DeepSpeed quantizes the 16-bit weights its fp16 optimizer
  // keeps, after each step (and before the first): the forwards see the same quantized weights
  // as quantizing in forward, while the fp32 masters take the updates. Its bit schedule
  // (start_bits down to target_bits), stochastic rounding and fp16 mixing act only there.
  if (!in_forward) {
    const std::string key = shared_path + ".quantize_weight_in_forward";
    if (!sixteen_bit) {
      bad_value(key, false,
                "without fp16 or bf16 there are no 16-bit weights to quantize after each step; "
                "set it true");
    }
    if (rounding != "nearest") {
      bad_value(shared_path + ".rounding", rounding,
                "only \"nearest\" rounding is available (stochastic rounding of the weights "
                "after each step is not)");
    }
    if (mixed) {
      bad_value(shared_path + ".fp16_mixed_quantize.enabled", true,
                "mixing fp16 and quantized weights is not available");
    }
  }
  const Groups read = read_groups(section, path, [&](const Json& params, const std::string& at) {
    const int64_t target = bits_at(params, at, "target_bits");
    if (!in_forward && params.contains("start_bits") &&
        bits_at(params, at, "start_bits") != target) {
      bad_value(at + ".start_bits", params.at("start_bits"),
                "the schedule from start_bits down to target_bits is not available; set both "
                "to the bits wanted");
    }
    return target;
  });
  out.set("compression.weight_bits", toml_ints(read.bits));
  out.set("compression.weight_modules", toml_groups(read.modules));
  out.set_int("compression.weight_groups", groups);
  out.set_string("compression.weight_type", type);
  out.set_int("compression.weight_offset", offset);
}

void import_activation_quantization(const Json& section, Overrides& out) {
  const std::string path = "compression_training.activation_quantization";
  const Json shared = shared_parameters(section, path);
  const std::string shared_path = path + ".shared_parameters";
  bool enabled = false;
  int64_t offset = 1000;  // DeepSpeed's default
  std::string type = "symmetric";
  for (const auto& [key, value] : shared.items()) {
    const std::string key_path = shared_path + "." + key;
    if (key == "enabled") {
      enabled = bool_or_auto(value, key_path).value_or(false);
    } else if (key == "schedule_offset") {
      offset = int_or_auto(value, key_path).value_or(1000);
    } else if (key == "quantization_type") {
      type = quantization_type(value, key_path);
    } else if (key == "range_calibration") {
      require_value(value, key_path, "dynamic",
                    "only \"dynamic\" ranges (each token's own) are available; \"static\" "
                    "ranges kept across steps are not");
    } else {
      unknown_key(key_path);
    }
  }
  if (!enabled) return;
  if (!shared.contains("schedule_offset")) {
    out.decide(shared_path + ".schedule_offset",
               "absent: inputs quantized from step 1001 (DeepSpeed's default offset 1000)");
  }
  const Groups read = read_groups(section, path, [](const Json& params, const std::string& at) {
    return bits_at(params, at, "bits");
  });
  out.set("compression.activation_bits", toml_ints(read.bits));
  out.set("compression.activation_modules", toml_groups(read.modules));
  out.set_string("compression.activation_type", type);
  out.set_int("compression.activation_offset", offset);
}

// Whether a pruning technique or layer reduction is switched on.
bool technique_enabled(const Json& section) {
  if (!section.is_object()) return true;
  if (section.contains("enabled")) return section.at("enabled") != false;
  if (section.contains("shared_parameters") && section.at("shared_parameters").is_object()) {
    const Json& shared = section.at("shared_parameters");
    return shared.contains("enabled") && shared.at("enabled") != false;
  }
  return false;
}

}  // namespace

void import_ds_compression(const Json& section, bool sixteen_bit, Overrides& out) {
  object_at(section, "compression_training");
  for (const auto& [key, value] : section.items()) {
    if (key == "weight_quantization") {
      import_weight_quantization(value, sixteen_bit, out);
    } else if (key == "activation_quantization") {
      import_activation_quantization(value, out);
    } else if (key == "sparse_pruning" || key == "row_pruning" || key == "head_pruning" ||
               key == "channel_pruning" || key == "layer_reduction") {
      if (technique_enabled(value)) {
        throw std::invalid_argument(
            "ds_config key 'compression_training." + key + "': " +
            (key == "layer_reduction"
                 ? std::string("layer reduction (a student initialized "
                               "from a teacher's layers)")
                 : "DeepSpeed's " + key.substr(0, key.find('_')) + " pruning") +
            " is not available in shardtrain (weight and activation "
            "quantization are)");
      }
    } else {
      unknown_key("compression_training." + key);
    }
  }
}

}  // namespace shardtrain::detail
