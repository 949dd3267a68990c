// Each subcommand registers its flags on the app and runs through the callback it sets.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace shardtrain::cli {

// Adds `launch`; `command` is the program after "--", split off before parsing.
void add_launch_command(CLI::App& app, const std::vector<std::string>& command, int& exit_code);
void add_bench_command(CLI::App& app, int& exit_code);
void add_train_command(CLI::App& app, int& exit_code);
void add_data_command(CLI::App& app, int& exit_code);

}  // namespace shardtrain::cli
