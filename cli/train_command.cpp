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
  cmd->add_option("--config,-c", *config_path, "TOML config file")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--set", *overrides,
                  "Override one key: --set section.key=value (repeatable; values are TOML, bare "
                  "words are strings)")
      ->take_all();
  cmd->callback([=] {
    TrainConfig config = load_train_config(*config_path, *overrides);
    // Under a launcher (torchrun, mpirun, srun, shardtrain launch) every rank joins the world.
    std::shared_ptr<ProcessGroup> world;
    if (rendezvous_info(current_environment()).world_size > 1) world = init_from_environment();
    Trainer trainer(std::move(config), world);
    trainer.fit();
  });
}

}  // namespace shardtrain::cli
