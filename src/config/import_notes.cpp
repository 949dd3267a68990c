// The lines that tell a user what an imported DeepSpeed or accelerate file left to the TOML config
// ("auto") and which of its tool's defaults the importer applied.
#include <functional>
#include <map>
#include <sstream>

#include "shardtrain/config.h"

namespace shardtrain {
namespace {

using ReadValue = std::function<std::string(const TrainConfig&)>;

template <typename T>
std::string text_of(const T& value) {
  std::ostringstream out;
  if constexpr (std::is_same_v<T, std::string>) {
    out << '"' << value << '"';
  } else if constexpr (std::is_same_v<T, bool>) {
    out << (value ? "true" : "false");
  } else {
    out << value;
  }
  return out.str();
}

// The keys an importer can leave to the TOML config, read back from the config they made.
const std::map<std::string, ReadValue>& readable_keys() {
  static const std::map<std::string, ReadValue> keys = {
      {"train.micro_batch", [](const TrainConfig& c) { return text_of(c.train.micro_batch); }},
      {"train.grad_accum", [](const TrainConfig& c) { return text_of(c.train.grad_accum); }},
      {"train.lr", [](const TrainConfig& c) { return text_of(c.train.lr); }},
      {"train.min_lr", [](const TrainConfig& c) { return text_of(c.train.min_lr); }},
      {"train.beta1", [](const TrainConfig& c) { return text_of(c.train.beta1); }},
      {"train.beta2", [](const TrainConfig& c) { return text_of(c.train.beta2); }},
      {"train.eps", [](const TrainConfig& c) { return text_of(c.train.eps); }},
      {"train.weight_decay", [](const TrainConfig& c) { return text_of(c.train.weight_decay); }},
      {"train.clip", [](const TrainConfig& c) { return text_of(c.train.clip); }},
      {"train.warmup", [](const TrainConfig& c) { return text_of(c.train.warmup); }},
      {"train.bias_correction",
       [](const TrainConfig& c) { return text_of(c.train.bias_correction); }},
      {"train.lamb_min_coeff",
       [](const TrainConfig& c) { return text_of(c.train.lamb_min_coeff); }},
      {"train.lamb_max_coeff",
       [](const TrainConfig& c) { return text_of(c.train.lamb_max_coeff); }},
      {"train.freeze_step", [](const TrainConfig& c) { return text_of(c.train.freeze_step); }},
      {"train.lamb_coeff_beta",
       [](const TrainConfig& c) { return text_of(c.train.lamb_coeff_beta); }},
      {"train.lamb_factor_min",
       [](const TrainConfig& c) { return text_of(c.train.lamb_factor_min); }},
      {"train.lamb_factor_max",
       [](const TrainConfig& c) { return text_of(c.train.lamb_factor_max); }},
      {"train.lamb_factor_threshold",
       [](const TrainConfig& c) { return text_of(c.train.lamb_factor_threshold); }},
      {"train.warmup_type", [](const TrainConfig& c) { return text_of(c.train.warmup_type); }},
      {"train.schedule",
       [](const TrainConfig& c) {
         return text_of(c.train.schedule) + ", train.warmup = " + text_of(c.train.warmup);
       }},
      {"train.steps", [](const TrainConfig& c) { return text_of(c.train.steps); }},
      {"run.log_every", [](const TrainConfig& c) { return text_of(c.run.log_every); }},
      {"parallel.tp", [](const TrainConfig& c) { return text_of(c.parallel.tp); }},
      {"precision.autocast", [](const TrainConfig& c) { return text_of(c.precision.autocast); }},
      {"precision.param_dtype",
       [](const TrainConfig& c) {
         return text_of(c.precision.param_dtype) +
                ", precision.autocast = " + text_of(c.precision.autocast);
       }},
      {"precision.initial_scale",
       [](const TrainConfig& c) { return text_of(c.precision.initial_scale); }},
      {"precision.scale_window",
       [](const TrainConfig& c) { return text_of(c.precision.scale_window); }},
      {"precision.min_scale", [](const TrainConfig& c) { return text_of(c.precision.min_scale); }},
      {"precision.consecutive_hysteresis",
       [](const TrainConfig& c) { return text_of(c.precision.consecutive_hysteresis); }},
      {"parallel.zero.overlap_comm",
       [](const TrainConfig& c) { return text_of(c.parallel.zero.overlap_comm); }},
      {"parallel.zero.contiguous_gradients",
       [](const TrainConfig& c) { return text_of(c.parallel.zero.contiguous_gradients); }},
      {"parallel.zero.reduce_bucket_size",
       [](const TrainConfig& c) { return text_of(c.parallel.zero.reduce_bucket_size); }},
      {"parallel.zero.allgather_bucket_size",
       [](const TrainConfig& c) { return text_of(c.parallel.zero.allgather_bucket_size); }},
      {"parallel.zero.prefetch_bucket_size",
       [](const TrainConfig& c) { return text_of(c.parallel.zero.prefetch_bucket_size); }},
      {"parallel.zero.param_persistence_threshold",
       [](const TrainConfig& c) { return text_of(c.parallel.zero.param_persistence_threshold); }},
      {"parallel.zero.max_live_parameters",
       [](const TrainConfig& c) { return text_of(c.parallel.zero.max_live_parameters); }},
  };
  return keys;
}

}  // namespace

std::vector<std::string> describe_import_notes(const TrainConfig& config, const std::string& file,
                                               const std::vector<ImportNote>& notes) {
  std::vector<std::string> lines;
  for (const ImportNote& note : notes) {
    std::string line = file + ": ";
    if (!note.text.empty()) {
      line += "'" + note.file_key + "' " + note.text;
    } else {
      const auto& keys = readable_keys();
      const auto value = keys.find(note.config_key);
      line += "'" + note.file_key + "' left to the TOML config: " + note.config_key + " = " +
              (value == keys.end() ? std::string("its value") : value->second(config));
    }
    lines.push_back(line);
  }
  return lines;
}

}  // namespace shardtrain
