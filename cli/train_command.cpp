#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "commands.h"
#include "shardtrain/rendezvous.h"
#include "shardtrain/train.h"

namespace shardtrain::cli {
namespace {

// A refusal that begins with a config key (the config's checks, the model's, the trainer's) of a
// key an imported file set, and --set did not, names that file.
std::invalid_argument naming_its_file(
    const std::invalid_argument& error, const std::vector<std::string>& set_on_command_line,
    const std::vector<std::pair<std::string, std::vector<std::string>>>& imported) {
  const std::string text = error.what();
  const std::string key = text.substr(0, text.find_first_of(": "));
  auto sets = [&](const std::vector<std::string>& overrides) {
    return std::any_of(overrides.begin(), overrides.end(),
                       [&](const std::string& o) { return o.rfind(key + "=", 0) == 0; });
  };
  if (key.find('.') == std::string::npos || sets(set_on_command_line)) return error;
  for (const auto& [file, overrides] : imported) {
    if (!file.empty() && sets(overrides)) {
      return std::invalid_argument(file + ": " + text + " (" + key + " is this file's setting)");
    }
  }
  return error;
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "train",
      "Train a model from a TOML config (sections [model] [data] [train] [precision] [run]; see "
      "docs/config.md). Writes RUN_DIR/metrics.jsonl and RUN_DIR/checkpoints/.");
  // Every value an option writes into lives in `a`, which the callback owns (see ckpt_command).
  struct TrainArgs {
    std::string config;
    std::vector<std::string> overrides;
    std::string deepspeed;
    std::string accelerate;
  };
  auto a = std::make_shared<TrainArgs>();
  cmd->add_option("--config,-c", a->config, "TOML config file")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--set", a->overrides,
                  "Override one key: --set section.key=value (repeatable; values are TOML, bare "
                  "words are strings)")
      ->take_all();
  cmd->add_option(
         "--deepspeed", a->deepspeed,
         "DeepSpeed ds_config.json: its ZeRO, precision, batch, optimizer, scheduler, "
         "quantization, layer- and token-dropping and autotuning settings override the TOML (see "
         "docs/deepspeed.md)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--accelerate-config", a->accelerate,
                  "accelerate config YAML with distributed_type FSDP: its FSDP and precision "
                  "settings override the TOML (see docs/deepspeed.md)")
      ->check(CLI::ExistingFile);
  cmd->callback([a] {
    // The imported files are applied on top of the TOML, and --set wins over both.
    const RendezvousInfo launched = rendezvous_info(current_environment());
    const int world_size = launched.world_size;
    std::vector<std::string> all;
    std::vector<ImportNote> ds_notes;
    std::vector<ImportNote> accelerate_notes;
    std::vector<std::pair<std::string, std::vector<std::string>>> imported;
    if (!a->deepspeed.empty()) {
      imported.emplace_back(a->deepspeed, deepspeed_overrides(a->deepspeed, world_size, &ds_notes));
    }
    if (!a->accelerate.empty()) {
      imported.emplace_back(a->accelerate,
                            accelerate_overrides(a->accelerate, world_size, &accelerate_notes));
    }
    for (const auto& [file, overrides] : imported)
      all.insert(all.end(), overrides.begin(), overrides.end());
    // `shardtrain launch --timeout` reaches every rank through the environment; --set wins.
    if (const char* timeout = std::getenv("SHARDTRAIN_TIMEOUT")) {
      all.push_back(std::string("run.timeout=") + timeout);
    }
    all.insert(all.end(), a->overrides.begin(), a->overrides.end());
    auto from_file = [&](const std::invalid_argument& error) {
      return naming_its_file(error, a->overrides, imported);
    };
    TrainConfig config;
    try {
      config = load_train_config(a->config, all);
    } catch (const std::invalid_argument& error) {
      throw from_file(error);
    }
    // What the imported files left to the TOML or took from their tools' defaults, once.
    if (launched.rank == 0) {
      for (const auto& [file, notes] :
           {std::pair{a->deepspeed, ds_notes}, std::pair{a->accelerate, accelerate_notes}}) {
        for (const std::string& line : describe_import_notes(config, file, notes)) {
          std::cout << line << "\n";
        }
      }
      std::cout.flush();
    }
    // Under a launcher (torchrun, mpirun, srun, shardtrain launch) every rank joins the world.
    std::shared_ptr<ProcessGroup> world;
    // Under replica fault tolerance the trainer joins the launcher's store itself.
    if (world_size > 1 && config.run.fault_tolerance != "replicas") {
      world = init_from_environment(ProcessGroupOptions().timeout(
          std::chrono::milliseconds(static_cast<int64_t>(config.run.timeout * 1000))));
    }
    // The micro-batch is measured before the run starts, on the same ranks; a restarted job
    // continues with what its first start chose.
    if (config.train.autotune) {
      std::optional<TrainConfig> chosen;
      if (launched.restart_count > 0) chosen = micro_batch_of_run(config);
      config = chosen ? *chosen : autotune_micro_batch(config, world);
    }
    try {
      Trainer trainer(std::move(config), world, launched.restart_count);
      trainer.fit();
    } catch (const std::invalid_argument& error) {
      throw from_file(error);
    }
  });
}

}  // namespace shardtrain::cli
