// The "optimizer" and "scheduler" sections of a ds_config.json. shardtrain trains with AdamW,
// LAMB, 1-bit Adam or 1-bit LAMB and a warmup followed by a constant, linear or cosine schedule;
// DeepSpeed's Adam/AdamW, Lamb, OneBitAdam and OneBitLamb and its WarmupLR, WarmupDecayLR and
// WarmupCosineLR map onto those when their shapes agree.
#include <algorithm>
#include <cctype>
#include <iterator>
#include <map>
#include <utility>

#include "config/deepspeed_json.h"

namespace shardtrain::detail {
namespace {

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

// The keys every Adam-family optimizer shares; false for another key.
bool import_shared_param(const std::string& key, const Json& value, std::optional<double>& lr,
                         Overrides& out) {
  const std::string path = "optimizer.params." + key;
  if (key == "lr") {
    lr = number_or_auto(value, path);
    out.set_float_or_keep(path, "train.lr", lr);
  } else if (key == "betas") {
    if (is_auto(value)) {
      out.keep(path, "train.beta1");
      out.keep(path, "train.beta2");
      return true;
    }
    if (!value.is_array() || value.size() != 2 || !value[0].is_number() || !value[1].is_number()) {
      bad_value(path, value, "expected [beta1, beta2] or \"auto\"");
    }
    out.set_float("train.beta1", value[0].get<double>());
    out.set_float("train.beta2", value[1].get<double>());
  } else if (key == "eps") {
    out.set_float_or_keep(path, "train.eps", number_or_auto(value, path));
  } else if (key == "weight_decay") {
    out.set_float_or_keep(path, "train.weight_decay", number_or_auto(value, path));
  } else if (key == "amsgrad") {
    require_value(value, path, false, "AMSGrad is not supported");
  } else if (key == "eps_inside_sqrt") {
    require_value(value, path, false, "only eps added to sqrt(v) is supported");
  } else {
    return false;
  }
  return true;
}

void import_bias_correction(const Json& value, Overrides& out) {
  const std::string path = "optimizer.params.bias_correction";
  if (is_auto(value)) {
    out.keep(path, "train.bias_correction");
  } else if (!value.is_boolean()) {
    throw std::invalid_argument("ds_config key '" + path + "' must be true or false, got " +
                                value.dump());
  } else {
    out.set("train.bias_correction", value.get<bool>() ? "true" : "false");
  }
}

void import_adam_params(const Json& params, const std::string& type, std::optional<double>& lr,
                        Overrides& out) {
  for (const auto& [key, value] : params.items()) {
    const std::string path = "optimizer.params." + key;
    if (import_shared_param(key, value, lr, out)) continue;
    if (key == "adam_w_mode") {
      // DeepSpeed's "Adam" decouples weight decay (AdamW) unless adam_w_mode is false.
      require_value(value, path, true,
                    "only true is supported: shardtrain's optimizer is AdamW (decoupled weight "
                    "decay); " +
                        type + " with L2 regularisation is not available");
    } else if (key == "bias_correction") {
      import_bias_correction(value, out);
    } else if (key == "torch_adam" || key == "fused") {
      bool_or_auto(value, path);  // which implementation DeepSpeed picks; same update
    } else {
      unknown_key(path);
    }
  }
}

// The numeric LAMB keys of Lamb (the first two) and OneBitLamb (all), and what each sets.
const std::pair<const char*, const char*> kLambKeys[] = {
    {"max_coeff", "train.lamb_max_coeff"},   {"min_coeff", "train.lamb_min_coeff"},
    {"coeff_beta", "train.lamb_coeff_beta"}, {"factor_max", "train.lamb_factor_max"},
    {"factor_min", "train.lamb_factor_min"}, {"factor_threshold", "train.lamb_factor_threshold"}};

// `key` among the first `count` of kLambKeys: its value set; false for another key.
bool import_lamb_key(const std::string& key, const Json& value, size_t count, Overrides& out) {
  for (size_t i = 0; i < count; ++i) {
    if (key != kLambKeys[i].first) continue;
    const std::string path = "optimizer.params." + key;
    out.set_float_or_keep(path, kLambKeys[i].second, number_or_auto(value, path));
    return true;
  }
  return false;
}

void import_lamb_params(const Json& params, std::optional<double>& lr, Overrides& out) {
  for (const auto& [key, value] : params.items()) {
    const std::string path = "optimizer.params." + key;
    if (import_shared_param(key, value, lr, out) || import_lamb_key(key, value, 2, out)) continue;
    if (key == "bias_correction") {
      import_bias_correction(value, out);
    } else if (key == "max_grad_norm") {
      require_value(value, path, 0, "only 0 (gradient_clipping clips the gradients)");
    } else {
      unknown_key(path);
    }
  }
}

// OneBitAdam's, OneBitLamb's and ZeroOneAdam's; the LAMB keys only for OneBitLamb, the variance
// and local-step intervals only for ZeroOneAdam.
void import_onebit_params(const Json& params, const std::string& type, std::optional<double>& lr,
                          Overrides& out) {
  const size_t lamb_keys = lower(type) == "onebitlamb" ? std::size(kLambKeys) : 0;
  const bool zero_one = lower(type) == "zerooneadam";
  for (const auto& [key, value] : params.items()) {
    const std::string path = "optimizer.params." + key;
    if (import_shared_param(key, value, lr, out) || import_lamb_key(key, value, lamb_keys, out)) {
      continue;
    }
    if (key == "bias_correction") {
      if (bool_or_auto(value, path).value_or(false)) {
        out.decide(path, "true: DeepSpeed's " + type +
                             " applies no bias correction; neither does shardtrain's "
                             "(train.bias_correction = false)");
      }
    } else if (key == "freeze_step" && !zero_one) {
      out.set_int_or_keep(path, "train.freeze_step", int_or_auto(value, path));
    } else if (zero_one && (key == "var_freeze_step" || key == "var_update_scaler" ||
                            key == "local_step_scaler" || key == "local_step_clipper")) {
      out.set_int_or_keep(path, "train." + key, int_or_auto(value, path));
    } else if (key == "cuda_aware") {
      // How DeepSpeed's compressed all-reduce reaches its transport (MPI, CUDA-aware MPI,
      // NCCL): shardtrain compresses over its own process group (Gloo on the CPU, NCCL on CUDA).
      bool_or_auto(value, path);
    } else if (key == "comm_backend_name") {
      out.decide(path, string_at(value, path) +
                           ": the compressed momentum goes over shardtrain's own process group "
                           "(Gloo on the CPU, NCCL on CUDA)");
    } else {
      unknown_key(path);
    }
  }
}

// DeepSpeed's warmup shapes: "log" (its default) and "linear".
void import_warmup_type(const Json& params, Overrides& out) {
  const std::string path = "scheduler.params.warmup_type";
  if (!params.contains("warmup_type")) {
    out.set_string("train.warmup_type", "log");
    out.decide(path, "absent: DeepSpeed's default \"log\" warmup");
    return;
  }
  const Json& value = params.at("warmup_type");
  if (is_auto(value)) return out.keep(path, "train.warmup_type");
  const std::string type = string_at(value, path);
  if (type != "linear" && type != "log") bad_value(path, value, "expected \"linear\" or \"log\"");
  out.set_string("train.warmup_type", type);
}

}  // namespace

std::optional<double> import_ds_optimizer(const Json& section, Overrides& out) {
  object_at(section, "optimizer");
  if (!section.contains("type")) {
    throw std::invalid_argument("ds_config key 'optimizer.type' is missing");
  }
  const std::string type = string_at(section.at("type"), "optimizer.type");
  const std::string kind = lower(type);
  const std::map<std::string, std::string> optimizers = {{"adam", "adamw"},
                                                         {"adamw", "adamw"},
                                                         {"lamb", "lamb"},
                                                         {"onebitadam", "onebit_adam"},
                                                         {"onebitlamb", "onebit_lamb"},
                                                         {"zerooneadam", "zero_one_adam"}};
  if (!optimizers.count(kind)) {
    bad_value("optimizer.type", section.at("type"),
              "shardtrain has Adam, AdamW, Lamb, OneBitAdam, OneBitLamb and ZeroOneAdam; " + type +
                  " is not available (docs/deepspeed.md, \"What is refused\")");
  }
  out.set_string("train.optimizer", optimizers.at(kind));
  const bool onebit = kind == "onebitadam" || kind == "onebitlamb" || kind == "zerooneadam";
  // DeepSpeed's OneBitAdam, OneBitLamb and ZeroOneAdam read no bias_correction: their updates
  // have none.
  if (onebit) out.set_bool("train.bias_correction", false);
  std::optional<double> lr;
  for (const auto& [key, value] : section.items()) {
    if (key == "type") continue;
    if (key != "params") unknown_key("optimizer." + key);
    object_at(value, "optimizer.params");
    if (kind == "lamb") {
      import_lamb_params(value, lr, out);
    } else if (onebit) {
      import_onebit_params(value, type, lr, out);
    } else {
      import_adam_params(value, type, lr, out);
    }
  }
  return lr;
}

void import_ds_scheduler(const Json& section, std::optional<double> optimizer_lr, Overrides& out) {
  object_at(section, "scheduler");
  if (!section.contains("type")) {
    throw std::invalid_argument("ds_config key 'scheduler.type' is missing");
  }
  for (const auto& [key, value] : section.items()) {
    if (key != "type" && key != "params") unknown_key("scheduler." + key);
  }
  const std::string type = string_at(section.at("type"), "scheduler.type");
  const Json params = section.value("params", Json::object());
  object_at(params, "scheduler.params");
  std::vector<std::string> allowed;
  if (type == "WarmupLR" || type == "WarmupDecayLR") {
    allowed = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"};
    if (type == "WarmupDecayLR") allowed.push_back("total_num_steps");
  } else if (type == "WarmupCosineLR") {
    allowed = {"warmup_min_ratio", "cos_min_ratio", "warmup_num_steps", "warmup_type",
               "total_num_steps"};
  } else {
    bad_value("scheduler.type", section.at("type"),
              "only WarmupLR, WarmupDecayLR and WarmupCosineLR are supported");
  }
  for (const auto& [key, value] : params.items()) {
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      unknown_key("scheduler.params." + key);
    }
  }
  import_warmup_type(params, out);
  // shardtrain's warmup rises from 0 to train.lr, so it starts from 0 there as well.
  for (const char* key : {"warmup_min_lr", "warmup_min_ratio"}) {
    if (params.contains(key)) {
      require_value(params.at(key), std::string("scheduler.params.") + key, 0,
                    "only 0 is supported (warmup starts from 0)");
    }
  }
  if (params.contains("warmup_num_steps")) {
    const std::string path = "scheduler.params.warmup_num_steps";
    out.set_int_or_keep(path, "train.warmup", int_or_auto(params.at("warmup_num_steps"), path));
  } else {
    out.set_int("train.warmup", 1000);
    out.decide("scheduler.params.warmup_num_steps", "absent: DeepSpeed's default 1000 steps");
  }
  if (params.contains("total_num_steps")) {
    const std::string path = "scheduler.params.total_num_steps";
    out.set_int_or_keep(path, "train.steps", int_or_auto(params.at("total_num_steps"), path));
  }
  if (params.contains("warmup_max_lr")) {
    const auto max_lr =
        number_or_auto(params.at("warmup_max_lr"), "scheduler.params.warmup_max_lr");
    if (max_lr && optimizer_lr && *max_lr != *optimizer_lr) {
      bad_value("scheduler.params.warmup_max_lr", params.at("warmup_max_lr"),
                "differs from optimizer.params.lr " + std::to_string(*optimizer_lr) +
                    "; shardtrain has one peak learning rate (train.lr)");
    }
    if (max_lr) out.set_float("train.lr", *max_lr);
    if (!max_lr && !optimizer_lr) out.keep("scheduler.params.warmup_max_lr", "train.lr");
  } else if (type != "WarmupCosineLR") {
    // WarmupLR and WarmupDecayLR rise to warmup_max_lr, 0.001 unless given, whatever the
    // optimizer's lr.
    out.set_float("train.lr", 1e-3);
    out.decide("scheduler.params.warmup_max_lr",
               optimizer_lr && *optimizer_lr != 1e-3
                   ? "absent: DeepSpeed's default 0.001, which it uses in place of "
                     "optimizer.params.lr"
                   : "absent: DeepSpeed's default 0.001");
  }
  if (type == "WarmupLR") {
    out.set_string("train.schedule", "constant");
  } else if (type == "WarmupDecayLR") {
    out.set_string("train.schedule", "linear");
    out.set_float("train.min_lr", 0.0);  // decays linearly to warmup_min_lr, which is 0
  } else {
    out.set_string("train.schedule", "cosine");
    // DeepSpeed's default floor is 1e-4 of the peak.
    const auto ratio =
        params.contains("cos_min_ratio")
            ? number_or_auto(params.at("cos_min_ratio"), "scheduler.params.cos_min_ratio")
            : std::optional<double>(1e-4);
    if (ratio && *ratio != 0.0) {
      if (!optimizer_lr) {
        throw std::invalid_argument("ds_config: scheduler WarmupCosineLR with cos_min_ratio " +
                                    std::to_string(*ratio) +
                                    " needs a numeric optimizer.params.lr to set train.min_lr");
      }
      out.set_float("train.min_lr", *ratio * *optimizer_lr);
    } else if (ratio) {
      out.set_float("train.min_lr", 0.0);
    } else {
      out.keep("scheduler.params.cos_min_ratio", "train.min_lr");
    }
  }
}

}  // namespace shardtrain::detail
