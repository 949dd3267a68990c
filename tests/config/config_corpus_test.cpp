// Real DeepSpeed and accelerate files from public repositories (tests/assets/configs, sources in
// SOURCES.md): each one is imported onto the tiny example TOML and either becomes a valid config
// that runs what the file asks for (stage, precision, batch, schedule), or is refused for the
// reason tests/assets/configs/refused.txt gives it, a reason docs/deepspeed.md lists.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "shardtrain/config.h"

namespace shardtrain {
namespace config_corpus_test {

namespace fs = std::filesystem;
using Json = nlohmann::json;

const fs::path kCorpus = fs::path(SHARDTRAIN_SOURCE_DIR) / "tests" / "assets" / "configs";
const std::string kToml = std::string(SHARDTRAIN_SOURCE_DIR) + "/configs/zero_tiny.toml";

// refused.txt: "FILE<TAB>words the refusal contains" per line; '#' starts a comment.
std::map<std::string, std::string> expected_refusals() {
  std::map<std::string, std::string> refused;
  std::ifstream in(kCorpus / "refused.txt");
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const auto tab = line.find('\t');
    if (tab == std::string::npos) {
      ADD_FAILURE() << "refused.txt: no tab in '" << line << "'";
      continue;
    }
    refused[line.substr(0, tab)] = line.substr(tab + 1);
  }
  return refused;
}

int64_t number(const Json& value) { return static_cast<int64_t>(value.get<double>()); }

// The world a DeepSpeed file is written for: its three batch sizes fix the data-parallel ranks;
// otherwise any, so one.
int ds_world(const Json& ds) {
  const char* keys[] = {"train_batch_size", "train_micro_batch_size_per_gpu",
                        "gradient_accumulation_steps"};
  for (const char* key : keys) {
    if (!ds.contains(key) || !ds.at(key).is_number()) return 1;
  }
  const int64_t per_rank = number(ds.at(keys[1])) * number(ds.at(keys[2]));
  const int64_t total = number(ds.at(keys[0]));
  return per_rank > 0 && total % per_rank == 0 ? static_cast<int>(total / per_rank) : 1;
}

// What the file asks for that the config must say: stage, precision, batch and schedule.
void expect_as_the_file_says(const Json& ds, const TrainConfig& c, int world,
                             const std::string& name) {
  SCOPED_TRACE(name);
  const Json zero = ds.value("zero_optimization", Json::object());
  const int64_t stage = zero.contains("stage") ? number(zero.at("stage")) : 0;
  if (zero.contains("mics_shard_size") && number(zero.at("mics_shard_size")) > 0) {
    EXPECT_EQ(c.parallel.strategy, ParallelStrategy::kFsdp);
  } else if (stage == 0) {
    EXPECT_EQ(c.parallel.strategy, ParallelStrategy::kDdp);
  } else {
    EXPECT_EQ(c.parallel.strategy, ParallelStrategy::kZero);
    EXPECT_EQ(c.parallel.zero.stage, stage);
  }
  auto enabled = [&](const char* section) {
    return ds.contains(section) && ds.at(section).is_object() &&
           ds.at(section).value("enabled", Json(false)) == true;
  };
  if (enabled("fp16")) EXPECT_EQ(c.precision.autocast, "fp16");
  if (enabled("bf16") || enabled("bfloat16")) {
    EXPECT_TRUE(c.precision.param_dtype == "bf16" || c.precision.autocast == "bf16");
  }
  if (!enabled("fp16") && !enabled("bf16") && !enabled("bfloat16")) {
    // Precision left to the TOML, which trains in fp32.
    EXPECT_EQ(c.precision.autocast, "none");
    EXPECT_EQ(c.precision.param_dtype, "fp32");
  }
  if (ds.contains("train_micro_batch_size_per_gpu") &&
      ds.at("train_micro_batch_size_per_gpu").is_number()) {
    EXPECT_EQ(c.train.micro_batch, number(ds.at("train_micro_batch_size_per_gpu")));
  }
  if (ds.contains("gradient_accumulation_steps") &&
      ds.at("gradient_accumulation_steps").is_number()) {
    EXPECT_EQ(c.train.grad_accum, number(ds.at("gradient_accumulation_steps")));
  }
  if (ds.contains("train_batch_size") && ds.at("train_batch_size").is_number()) {
    const int64_t data_parallel = world / c.parallel.tp;
    EXPECT_EQ(c.train.micro_batch * c.train.grad_accum * data_parallel,
              number(ds.at("train_batch_size")));
  }
  if (ds.contains("scheduler")) {
    const std::string type = ds.at("scheduler").value("type", "");
    const std::map<std::string, std::string> kinds = {
        {"WarmupLR", "constant"}, {"WarmupDecayLR", "linear"}, {"WarmupCosineLR", "cosine"}};
    ASSERT_TRUE(kinds.count(type)) << type;
    EXPECT_EQ(c.train.schedule, kinds.at(type));
  } else if (ds.contains("optimizer")) {
    EXPECT_EQ(c.train.schedule, "constant");
    EXPECT_EQ(c.train.warmup, 0);
  }
  if (ds.contains("optimizer") && ds.at("optimizer").contains("params") &&
      ds.at("optimizer").at("params").contains("lr") &&
      ds.at("optimizer").at("params").at("lr").is_number() &&
      !(ds.contains("scheduler") &&
        !ds.at("scheduler").value("params", Json::object()).contains("warmup_max_lr") &&
        ds.at("scheduler").value("type", "") != "WarmupCosineLR")) {
    EXPECT_DOUBLE_EQ(c.train.lr, ds.at("optimizer").at("params").at("lr").get<double>());
  }
  if (ds.contains("progressive_layer_drop")) {
    const Json& pld = ds.at("progressive_layer_drop");
    const bool on = pld.value("enabled", false);
    EXPECT_EQ(c.train.layer_drop, on ? "progressive" : "none");
    if (on) {
      EXPECT_EQ(c.train.layer_drop_theta, pld.value("theta", 1.0));
      EXPECT_EQ(c.train.layer_drop_gamma, pld.value("gamma", 0.001));
    }
  }
  if (!ds.contains("optimizer")) return;
  const Json& optimizer = ds.at("optimizer");
  std::string type = optimizer.value("type", "");
  std::transform(type.begin(), type.end(), type.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  const std::map<std::string, std::string> optimizers = {{"adam", "adamw"},
                                                         {"adamw", "adamw"},
                                                         {"lamb", "lamb"},
                                                         {"onebitadam", "onebit_adam"},
                                                         {"onebitlamb", "onebit_lamb"},
                                                         {"zerooneadam", "zero_one_adam"}};
  ASSERT_TRUE(optimizers.count(type)) << type;
  EXPECT_EQ(c.train.optimizer, optimizers.at(type));
  const Json params = optimizer.value("params", Json::object());
  // DeepSpeed's 1-bit and 0/1 optimizers have no bias correction, whatever their params say.
  if (type == "onebitadam" || type == "onebitlamb" || type == "zerooneadam") {
    EXPECT_FALSE(c.train.bias_correction);
  } else if (params.contains("bias_correction")) {
    EXPECT_EQ(c.train.bias_correction, params.at("bias_correction").get<bool>());
  }
  if (params.contains("max_coeff"))
    EXPECT_EQ(c.train.lamb_max_coeff, params.at("max_coeff").get<double>());
  if (params.contains("min_coeff"))
    EXPECT_EQ(c.train.lamb_min_coeff, params.at("min_coeff").get<double>());
  if (params.contains("factor_threshold")) {
    EXPECT_EQ(c.train.lamb_factor_threshold, params.at("factor_threshold").get<double>());
  }
  if (params.contains("freeze_step")) {
    EXPECT_EQ(c.train.freeze_step, number(params.at("freeze_step")));
  }
  if (params.contains("var_freeze_step")) {
    EXPECT_EQ(c.train.var_freeze_step, number(params.at("var_freeze_step")));
  }
  if (params.contains("local_step_scaler")) {
    EXPECT_EQ(c.train.local_step_scaler, number(params.at("local_step_scaler")));
  }
}

std::string read(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// SOURCES.md's rows: each corpus file's repository and path there.
std::map<std::string, std::pair<std::string, fs::path>> sources() {
  std::map<std::string, std::pair<std::string, fs::path>> out;
  std::ifstream in(kCorpus / "SOURCES.md");
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> cells;
    std::istringstream row(line);
    for (std::string cell; std::getline(row, cell, '|');) {
      const auto first = cell.find_first_not_of(' '), last = cell.find_last_not_of(' ');
      cells.push_back(first == std::string::npos ? "" : cell.substr(first, last - first + 1));
    }
    if (cells.size() >= 4 && cells[1].find('/') != std::string::npos) {
      out[cells[1]] = {cells[2], fs::path(cells[3])};
    }
  }
  return out;
}

// An accelerate file that names a deepspeed_config_file by its path in the file's repository
// is read where that path leads: the two corpus files laid out under `root` as they are there.
// Other files are read where they are.
fs::path as_in_its_repository(const std::string& name, const fs::path& root) {
  const std::string text = read(kCorpus / name);
  const std::string key = "deepspeed_config_file:";
  const auto at = text.find(key);
  if (at == std::string::npos) return kCorpus / name;
  std::string reference = text.substr(at + key.size(), text.find('\n', at) - at - key.size());
  reference.erase(0, reference.find_first_not_of(" '\""));
  reference.erase(reference.find_last_not_of(" '\"") + 1);
  const auto all = sources();
  const auto& [repository, own_path] = all.at(name);
  const fs::path wanted = (own_path.parent_path() / reference).lexically_normal();
  for (const auto& [other, source] : all) {
    if (source.first != repository || source.second != wanted) continue;
    const fs::path here = root / own_path.parent_path() / fs::path(name).filename();
    fs::create_directories(here.parent_path());
    fs::create_directories((root / wanted).parent_path());
    fs::copy_file(kCorpus / name, here, fs::copy_options::overwrite_existing);
    fs::copy_file(kCorpus / other, root / wanted, fs::copy_options::overwrite_existing);
    return here;
  }
  return kCorpus / name;  // not in the corpus: read where it is, and refused
}

// The compression_training quantization the file enables, as [compression] must hold it.
void expect_compression_as_the_file_says(const Json& ds, const TrainConfig& c) {
  const Json compression = ds.value("compression_training", Json::object());
  auto check = [&](const char* technique, const std::vector<int64_t>& bits,
                   const std::vector<std::vector<std::string>>& modules, const char* bits_key) {
    const Json section = compression.value(technique, Json::object());
    const Json shared = section.value("shared_parameters", Json::object());
    if (shared.value("enabled", false) != true) {
      EXPECT_TRUE(bits.empty()) << technique;
      return;
    }
    std::vector<int64_t> want_bits;
    std::vector<std::vector<std::string>> want_modules;
    for (const auto& [group, body] : section.at("different_groups").items()) {
      want_bits.push_back(number(body.at("params").at(bits_key)));
      want_modules.push_back(body.at("modules").get<std::vector<std::string>>());
    }
    EXPECT_EQ(bits, want_bits) << technique;
    EXPECT_EQ(modules, want_modules) << technique;
  };
  check("weight_quantization", c.compression.weight_bits, c.compression.weight_modules,
        "target_bits");
  check("activation_quantization", c.compression.activation_bits, c.compression.activation_modules,
        "bits");
}

// The file's data_efficiency.data_routing.random_ltd section, or null.
const Json* random_ltd_of(const Json& ds) {
  if (!ds.is_object() || !ds.contains("data_efficiency")) return nullptr;
  const Json& efficiency = ds.at("data_efficiency");
  if (!efficiency.contains("data_routing")) return nullptr;
  const Json& routing = efficiency.at("data_routing");
  return routing.contains("random_ltd") ? &routing.at("random_ltd") : nullptr;
}

void expect_random_ltd_as_the_file_says(const Json* ltd, const TrainConfig& c) {
  if (!ltd || ltd->value("enabled", false) != true) {
    EXPECT_TRUE(c.train.random_ltd_layers.empty());
    return;
  }
  EXPECT_EQ(c.train.random_ltd_layers, ltd->at("random_ltd_layer_id").get<std::vector<int64_t>>());
  const Json& schedule = ltd->at("random_ltd_schedule");
  EXPECT_EQ(c.train.random_ltd_min, number(schedule.at("min_value")));
  EXPECT_EQ(c.train.random_ltd_max, number(schedule.at("max_value")));
  EXPECT_EQ(c.train.random_ltd_steps, number(schedule.at("schedule_config").at("require_steps")));
  EXPECT_EQ(c.train.random_ltd_step, number(schedule.at("schedule_config").at("seq_per_step")));
  EXPECT_EQ(c.train.random_ltd_model_layers, number(ltd->at("total_layer_num")));
}

struct Outcome {
  bool accepted = false;
  std::string message;
};

TEST(ConfigCorpusTest, EveryFileRunsAsItSaysOrIsRefusedForItsListedReason) {
  const auto refusals = expected_refusals();
  const fs::path staging =
      fs::temp_directory_path() / ("shardtrain_corpus_" + std::to_string(::getpid()));
  std::map<std::string, Outcome> outcomes;
  int ds_files = 0, yaml_files = 0;
  for (const char* kind : {"deepspeed", "accelerate"}) {
    for (const auto& entry : fs::directory_iterator(kCorpus / kind)) {
      const fs::path path = entry.path();
      const std::string name = std::string(kind) + "/" + path.filename().string();
      Outcome outcome;
      try {
        if (std::string(kind) == "deepspeed") {
          ++ds_files;
          Json ds;
          try {
            ds = Json::parse(read(path));
          } catch (const Json::exception&) {
          }
          const int world = ds.is_object() ? ds_world(ds) : 1;
          std::vector<std::string> overrides = deepspeed_overrides(path.string(), world);
          // A random-LTD file names blocks of a model of total_layer_num blocks: the tiny model
          // gets that many.
          const Json* ltd = random_ltd_of(ds);
          if (ltd && ltd->contains("total_layer_num")) {
            overrides.push_back("model.n_layers=" +
                                std::to_string(number(ltd->at("total_layer_num"))));
          }
          const TrainConfig c = load_train_config(kToml, overrides);
          expect_as_the_file_says(ds, c, world, name);
          expect_random_ltd_as_the_file_says(ltd, c);
          expect_compression_as_the_file_says(ds, c);
          // An enabled autotuning block tunes a micro-batch the file leaves open.
          const Json tuning = ds.value("autotuning", Json::object());
          EXPECT_EQ(c.train.autotune, tuning.value("enabled", false) == true &&
                                          !(ds.contains("train_micro_batch_size_per_gpu") &&
                                            ds.at("train_micro_batch_size_per_gpu").is_number()))
              << name;
        } else {
          ++yaml_files;
          // The file's own process count is the launch's.
          std::istringstream text(read(path));
          int world = 1;
          bool one_process = false;
          for (std::string line; std::getline(text, line);) {
            if (line.rfind("num_processes:", 0) == 0) world = std::stoi(line.substr(14));
            // distributed_type NO runs one process, whatever num_processes says.
            if (line.rfind("distributed_type:", 0) == 0 && line.find("NO") != std::string::npos) {
              one_process = true;
            }
          }
          if (one_process) world = 1;
          const fs::path staged = as_in_its_repository(name, staging);
          const TrainConfig c =
              load_train_config(kToml, accelerate_overrides(staged.string(), world));
          // mixed_precision fp8: Transformer Engine's recipe (accelerate's default HYBRID).
          const std::string yaml = read(path);
          if (yaml.find("mixed_precision: fp8") != std::string::npos ||
              yaml.find("mixed_precision: \"fp8\"") != std::string::npos) {
            EXPECT_EQ(c.precision.fp8,
                      yaml.find("fp8_format: E4M3") != std::string::npos ? "e4m3" : "hybrid")
                << name;
            EXPECT_EQ(c.precision.autocast, "bf16") << name;
          } else {
            EXPECT_EQ(c.precision.fp8, "none") << name;
          }
        }
        outcome.accepted = true;
      } catch (const std::exception& e) {
        outcome.message = e.what();
      }
      outcomes[name] = outcome;
    }
  }
  int accepted = 0;
  for (const auto& [name, outcome] : outcomes) {
    const auto listed = refusals.find(name);
    if (outcome.accepted) {
      ++accepted;
      EXPECT_EQ(listed, refusals.end()) << name << " is listed as refused but was accepted";
    } else if (listed == refusals.end()) {
      ADD_FAILURE() << name << " was refused: " << outcome.message;
    } else {
      EXPECT_NE(outcome.message.find(listed->second), std::string::npos)
          << name << " was refused for another reason: " << outcome.message;
      // Every refusal names the file it comes from.
      EXPECT_NE(outcome.message.find(name.substr(name.find('/') + 1)), std::string::npos)
          << outcome.message;
    }
  }
  for (const auto& [name, why] : refusals) {
    EXPECT_TRUE(outcomes.count(name)) << "refused.txt lists " << name << ", not in the corpus";
  }
  fs::remove_all(staging);
  EXPECT_GE(ds_files, 60);
  EXPECT_GE(yaml_files, 30);
  std::cout << accepted << " of " << outcomes.size() << " files accepted (" << ds_files
            << " DeepSpeed, " << yaml_files << " accelerate)\n";
}

}  // namespace config_corpus_test
}  // namespace shardtrain
