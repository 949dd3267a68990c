// Reading values out of a ds_config.json: every accessor takes the key's path in the file so that
// an error names it, and "auto" (DeepSpeed's "fill this in from elsewhere") is told apart.
#pragma once

#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>

#include "config/import_common.h"

namespace shardtrain::detail {

using Json = nlohmann::json;

inline bool is_auto(const Json& value) { return value.is_string() && value == "auto"; }

[[noreturn]] inline void bad_value(const std::string& path, const Json& value,
                                   const std::string& why) {
  throw std::invalid_argument("ds_config key '" + path + "' = " + value.dump() + ": " + why);
}

[[noreturn]] inline void unknown_key(const std::string& path) {
  throw std::invalid_argument("ds_config key '" + path +
                              "' is not supported (see docs/deepspeed.md for the keys shardtrain "
                              "reads)");
}

inline const Json& object_at(const Json& value, const std::string& path) {
  if (!value.is_object()) bad_value(path, value, "expected an object");
  return value;
}

// A number or "auto" (nullopt).
inline std::optional<double> number_or_auto(const Json& value, const std::string& path) {
  if (is_auto(value)) return std::nullopt;
  if (!value.is_number()) bad_value(path, value, "expected a number or \"auto\"");
  return value.get<double>();
}

// An integer (JSON writes 5e8 for big ones, so an integral float counts) or "auto".
inline std::optional<int64_t> int_or_auto(const Json& value, const std::string& path) {
  const auto number = number_or_auto(value, path);
  if (!number) return std::nullopt;
  if (*number != std::floor(*number) || std::abs(*number) > 9e18) {
    bad_value(path, value, "expected an integer");
  }
  return static_cast<int64_t>(*number);
}

inline std::optional<bool> bool_or_auto(const Json& value, const std::string& path) {
  if (is_auto(value)) return std::nullopt;
  if (!value.is_boolean()) bad_value(path, value, "expected true, false or \"auto\"");
  return value.get<bool>();
}

inline std::string string_at(const Json& value, const std::string& path) {
  if (!value.is_string()) bad_value(path, value, "expected a string");
  return value.get<std::string>();
}

// Accepts only `expected` (or "auto"): a key whose other values would change what DeepSpeed does
// in a way shardtrain does not.
inline void require_value(const Json& value, const std::string& path, const Json& expected,
                          const std::string& why) {
  if (!is_auto(value) && value != expected) bad_value(path, value, why);
}

// The "optimizer" section; returns its learning rate when it gives a number.
std::optional<double> import_ds_optimizer(const Json& section, Overrides& out);
// The "scheduler" section; `optimizer_lr` is the optimizer's learning rate, if known.
void import_ds_scheduler(const Json& section, std::optional<double> optimizer_lr, Overrides& out);

// The "compression_training" section: weight and activation quantization as [compression];
// `sixteen_bit`: fp16 or bf16 is enabled (the weights DeepSpeed quantizes after each step).
void import_ds_compression(const Json& section, bool sixteen_bit, Overrides& out);

// The "autotuning" section: train.autotune and its range when the micro-batch is left to it
// (`micro_batch_given`: the file fixes train_micro_batch_size_per_gpu).
// `global_batch`: the file's train_batch_size, kept while the micro-batch changes.
void import_ds_autotuning(const Json& section, bool micro_batch_given,
                          std::optional<int64_t> global_batch, Overrides& out);

}  // namespace shardtrain::detail
