#include <cstdlib>
#include <iostream>

#include "commands.h"
#include "shardtrain/launch.h"

namespace shardtrain::cli {

void add_launch_command(CLI::App& app, const std::vector<std::string>& command, int& exit_code) {
  auto* cmd = app.add_subcommand(
      "launch",
      "Start N local ranks of PROGRAM with torchrun's environment (RANK WORLD_SIZE LOCAL_RANK "
      "LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT). Usage: shardtrain launch --nproc N [options] "
      "-- PROGRAM ARGS...");
  // Every value an option writes into lives in `a`, which the callback owns (see ckpt_command).
  struct LaunchArgs {
    LaunchOptions options;
    double kill_seconds = 10.0;
    double timeout = 0;
    bool no_prefix = false;
  };
  auto a = std::make_shared<LaunchArgs>();
  LaunchOptions* options = &a->options;
  cmd->add_option("--nproc,--nproc-per-node", options->nproc_, "Ranks to start on this node")
      ->required()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--nnodes", options->nnodes_, "Number of nodes in the job")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--node-rank", options->node_rank_,
                  "Index of this node; its ranks are node_rank*nproc .. +nproc-1")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--master-addr", options->master_addr_, "Address of the node hosting rank 0")
      ->capture_default_str();
  cmd->add_option("--master-port", options->master_port_,
                  "Port of the rendezvous store on rank 0 (default: a free port; required with "
                  "--nnodes > 1)")
      ->check(CLI::Range(1, 65535));
  cmd->add_option("--max-restarts", options->max_restarts_,
                  "Restart all local ranks up to R times after a failure")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--kill-timeout", a->kill_seconds,
                  "Seconds the other ranks get after SIGTERM before SIGKILL, once one failed")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--timeout", a->timeout,
                  "Seconds a rank's rendezvous or collective waits for the others before failing "
                  "(SHARDTRAIN_TIMEOUT for every rank; shardtrain train's run.timeout, default "
                  "1800)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--no-prefix", a->no_prefix, "Relay rank output without the '[rank N] ' prefix");
  cmd->footer("Exit status: 0 when every rank exited 0, else the failed rank's status.");
  cmd->callback([a, &command, &exit_code] {
    a->options.kill_timeout(
        std::chrono::milliseconds(static_cast<int64_t>(a->kill_seconds * 1000)));
    a->options.prefix_output(!a->no_prefix);
    if (a->timeout > 0) setenv("SHARDTRAIN_TIMEOUT", std::to_string(a->timeout).c_str(), 1);
    const LaunchResult result = launch(a->options, command);
    if (result.exit_code != 0) {
      std::cerr << "shardtrain launch: " << result.message << "\n";
      exit_code = result.exit_code;
    }
  });
}

}  // namespace shardtrain::cli
