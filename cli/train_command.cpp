#include <iostream>

#include "commands.h"
#include "shardtrain/rendezvous.h"
#include "shardtrain/train.h"

namespace shardtrain::cli {

void add_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "train",
      "Train a model from a TOML config (sections [model] [data] [train] [precision] [run]; see "
      "docs/config.md). Writes RUN_DIR/metrics.jsonl and RUN_DIR/checkpoints/.");
  auto config_path = std::make_shared<std::string>();
  auto overrides = std::make_shared<std::vector<std::string>>();
  auto deepspeed = std::make_shared<std::string>();
  auto accelerate = std::make_shared<std::string>();
  cmd->add_option("--config,-c", *config_path, "TOML config file")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--set", *overrides,
                  "Override one key: --set section.key=value (repeatable; values are TOML, bare "
                  "words are strings)")
      ->take_all();
  cmd->add_option("--deepspeed", *deepspeed,
                  "DeepSpeed ds_config.json: its ZeRO, precision, batch, optimizer and scheduler "
                  "settings override the TOML (see docs/deepspeed.md)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--accelerate-config", *accelerate,
                  "accelerate config YAML with distributed_type FSDP: its FSDP and precision "
                  "settings override the TOML (see docs/deepspeed.md)")
      ->check(CLI::ExistingFile);
  cmd->callback([=] {
    // The imported files are applied on top of the TOML, and --set wins over both.
    const int world_size = rendezvous_info(current_environment()).world_size;
    std::vector<std::string> all;
    if (!deepspeed->empty()) all = deepspeed_overrides(*deepspeed, world_size);
    if (!accelerate->empty()) {
      const auto imported = accelerate_overrides(*accelerate, world_size);
      all.insert(all.end(), imported.begin(), imported.end());
    }
    all.insert(all.end(), overrides->begin(), overrides->end());
    TrainConfig config = load_train_config(*config_path, all);
    // Under a launcher (torchrun, mpirun, srun, shardtrain launch) every rank joins the world.
    std::shared_ptr<ProcessGroup> world;
    if (world_size > 1) world = init_from_environment();
    Trainer trainer(std::move(config), world);
    trainer.fit();
  });
}

}  // namespace shardtrain::cli
