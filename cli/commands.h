// Each subcommand registers its flags on the app and runs through the callback it sets. A
// callback reports bad input by throwing std::invalid_argument (main exits 2); `exit_code` is
// for commands whose status comes from elsewhere (a launched rank, wrong benchmark results).
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace shardtrain::cli {

// Adds `launch`; `command` is the program after "--", split off before parsing.
void add_launch_command(CLI::App& app, const std::vector<std::string>& command, int& exit_code);
void add_bench_command(CLI::App& app, int& exit_code);
// `bench adam`, under the `bench` subcommand.
void add_bench_adam_command(CLI::App& bench);
// `bench scaling`, under the `bench` subcommand.
void add_bench_scaling_command(CLI::App& bench);
void add_bench_pipeline_command(CLI::App& bench);
void add_train_command(CLI::App& app);
void add_data_command(CLI::App& app);
// `generate CHECKPOINT`: text from a trained model on one process.
void add_generate_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_ckpt_command(CLI::App& app);
// `trace merge`.
void add_trace_command(CLI::App& app);
// `report RUN_DIR`: one self-contained HTML page of a run (docs/report.md).
void add_report_command(CLI::App& app);

}  // namespace shardtrain::cli
