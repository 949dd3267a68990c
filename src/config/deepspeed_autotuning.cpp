// ds_config's autotuning: DeepSpeed's tuner in its fast mode, the micro-batch measured before
// training (train.autotune).
#include <string>

#include "config/deepspeed_json.h"

namespace shardtrain::detail {

void import_ds_autotuning(const Json& section, bool micro_batch_given,
                          std::optional<int64_t> global_batch, Overrides& out) {
  object_at(section, "autotuning");
  const bool enabled = section.contains("enabled") &&
                       bool_or_auto(section.at("enabled"), "autotuning.enabled").value_or(false);
  if (!enabled) return;  // a switched-off block does nothing, whatever else it says
  Overrides settings;
  for (const auto& [key, value] : section.items()) {
    const std::string path = "autotuning." + key;
    if (key == "enabled") {
      continue;
    } else if (key == "max_train_batch_size") {
      settings.set_int_or_keep(path, "train.autotune_max_batch", int_or_auto(value, path));
    } else if (key == "min_train_micro_batch_size_per_gpu") {
      settings.set_int_or_keep(path, "train.autotune_min_micro_batch", int_or_auto(value, path));
    } else if (key == "max_train_micro_batch_size_per_gpu") {
      settings.set_int_or_keep(path, "train.autotune_max_micro_batch", int_or_auto(value, path));
    } else if (key == "start_profile_step") {
      settings.set_int_or_keep(path, "train.autotune_first_timed", int_or_auto(value, path));
    } else if (key == "end_profile_step") {
      settings.set_int_or_keep(path, "train.autotune_steps", int_or_auto(value, path));
    } else if (key == "min_train_batch_size") {
      require_value(value, path, 1, "only 1: the search starts at the smallest micro-batch");
    } else if (key == "metric") {
      require_value(value, path, "throughput",
                    "only \"throughput\" is measured (tokens per second)");
    } else if (key == "fast") {
      if (bool_or_auto(value, path) == false) {
        settings.decide(path,
                        "false: the micro-batch is tuned; ZeRO's other settings (which "
                        "DeepSpeed's slow mode tries too) stay as the file sets them");
      }
    } else if (key == "results_dir" || key == "exps_dir" || key == "overwrite" ||
               key == "metric_path" || key == "arg_mappings" || key == "model_info" ||
               key == "model_info_path" || key == "tuner_type" || key == "tuner_early_stopping" ||
               key == "tuner_num_trials" || key == "mp_size" ||
               key == "num_tuning_micro_batch_sizes") {
      // Where DeepSpeed's launcher writes its experiments, how it maps settings onto a script's
      // arguments, and how it searches: shardtrain measures in RUN_DIR.autotune and says what
      // it chose.
    } else {
      unknown_key(path);
    }
  }
  if (micro_batch_given) {
    out.decide("autotuning", "the file fixes train_micro_batch_size_per_gpu: nothing to tune");
    return;
  }
  out.set_bool("train.autotune", true);
  out.append(settings);
  if (global_batch) {
    // DeepSpeed's tuner keeps train_batch_size and derives the accumulation of each micro-batch.
    out.set_int("train.global_batch", *global_batch);
    out.set_int("train.grad_accum", 1);
  }
  out.forget("train_micro_batch_size_per_gpu");
  out.decide("train_micro_batch_size_per_gpu",
             "tuned before training (train.autotune: micro-batches from "
             "train.autotune_min_micro_batch, doubling, each trained a few steps and timed)");
}

}  // namespace shardtrain::detail
