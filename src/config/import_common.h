// Helpers shared by the DeepSpeed and accelerate importers: reading a file and writing override
// strings whose values parse back as the TOML value they stand for.
#pragma once

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "shardtrain/config.h"

namespace shardtrain::detail {

inline std::string read_config_file(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument(std::string(what) + " file '" + path + "' cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A TOML basic string.
inline std::string toml_string(const std::string& text) {
  std::string quoted = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') quoted += '\\';
    quoted += c;
  }
  return quoted + "\"";
}

// A TOML array of integers.
inline std::string toml_ints(const std::vector<int64_t>& values) {
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i) text += (i ? ", " : "") + std::to_string(values[i]);
  return text + "]";
}

// A TOML float that reads back to the same double (always with a '.' or an exponent, so a
// float key never sees an integer that could be mistaken for one).
inline std::string toml_float(double value) {
  std::string text;
  for (int digits = 15; digits <= 17; ++digits) {  // the shortest that reads back exactly
    std::ostringstream out;
    out.precision(digits);
    out << value;
    text = out.str();
    if (std::stod(text) == value) break;
  }
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
  return text;
}

// The overrides an importer produces, in the order they are applied.
class Overrides {
 public:
  void set(const std::string& key, const std::string& toml_value) {
    list_.push_back(key + "=" + toml_value);
  }
  // An override already written as "key=value" (another importer's).
  void set_line(const std::string& line) { list_.push_back(line); }
  void add_notes(const std::vector<ImportNote>& notes) {
    notes_.insert(notes_.end(), notes.begin(), notes.end());
  }
  void set_string(const std::string& key, const std::string& value) {
    set(key, toml_string(value));
  }
  void set_int(const std::string& key, int64_t value) { set(key, std::to_string(value)); }
  void set_float(const std::string& key, double value) { set(key, toml_float(value)); }
  void set_bool(const std::string& key, bool value) { set(key, value ? "true" : "false"); }
  void append(const Overrides& other) {
    list_.insert(list_.end(), other.list_.begin(), other.list_.end());
    notes_.insert(notes_.end(), other.notes_.begin(), other.notes_.end());
  }
  // `file_key` was "auto" (or absent where the tool takes it from elsewhere): `config_key` keeps
  // the TOML config's value, which the user is told.
  void keep(const std::string& file_key, const std::string& config_key) {
    notes_.push_back({file_key, config_key, ""});
  }
  // Drops what was noted about `file_key` (a later section decides it).
  void forget(const std::string& file_key) {
    notes_.erase(std::remove_if(notes_.begin(), notes_.end(),
                                [&](const ImportNote& n) { return n.file_key == file_key; }),
                 notes_.end());
  }
  // A value the importer chose for `file_key` (the tool's default), in words.
  void decide(const std::string& file_key, const std::string& text) {
    notes_.push_back({file_key, "", text});
  }
  // The value when there is one, else the TOML's.
  void set_int_or_keep(const std::string& file_key, const std::string& key,
                       std::optional<int64_t> value) {
    value ? set_int(key, *value) : keep(file_key, key);
  }
  void set_float_or_keep(const std::string& file_key, const std::string& key,
                         std::optional<double> value) {
    value ? set_float(key, *value) : keep(file_key, key);
  }
  void set_bool_or_keep(const std::string& file_key, const std::string& key,
                        std::optional<bool> value) {
    value ? set_bool(key, *value) : keep(file_key, key);
  }
  const std::vector<std::string>& list() const { return list_; }
  const std::vector<ImportNote>& notes() const { return notes_; }

 private:
  std::vector<std::string> list_;
  std::vector<ImportNote> notes_;
};

// DeepSpeed-Ulysses' all-to-all dtype (a ds_config's or accelerate's deepspeed_config's
// `seq_parallel_communication_data_type`, at `path`): the sequences are split by parallel.cp,
// whose ring attention communicates in the activations' dtype.
inline void ulysses_dtype_note(std::string dtype, const std::string& path, Overrides& out) {
  std::transform(dtype.begin(), dtype.end(), dtype.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (dtype != "fp32" && dtype != "bf16" && dtype != "fp16") {
    throw std::invalid_argument("'" + path + "' = \"" + dtype +
                                "\": expected \"fp32\", \"bf16\" or \"fp16\"");
  }
  out.decide(path, "\"" + dtype +
                       "\": the dtype of DeepSpeed-Ulysses' all-to-all; sequences split by "
                       "parallel.cp (ring attention: the same attention, other communication) "
                       "travel in the activations' dtype");
}

inline void require_world_size(int world_size) {
  if (world_size < 1) {
    throw std::invalid_argument("world size must be at least 1, got " + std::to_string(world_size));
  }
}

}  // namespace shardtrain::detail
