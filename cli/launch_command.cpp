#include <cmath>
#include <cstdlib>
#include <iostream>

#include "commands.h"
#include "shardtrain/launch.h"

namespace shardtrain::cli {

namespace {

// "--nnodes N" or "MIN:MAX" (elastic) into `options`.
void parse_nnodes(const std::string& text, LaunchOptions& options) {
  const auto number = [&text](const std::string& part) {
    size_t used = 0;
    int value = 0;
    try {
      value = std::stoi(part, &used);
    } catch (const std::exception&) {
      used = std::string::npos;
    }
    if (used != part.size() || part.empty() || value < 1 || value > (1 << 20)) {
      throw std::invalid_argument("--nnodes " + text +
                                  ": expected a number of nodes N or MIN:MAX, each from 1 to " +
                                  std::to_string(1 << 20));
    }
    return value;
  };
  const size_t colon = text.find(':');
  if (colon == std::string::npos) {
    options.nnodes(number(text));
    return;
  }
  // launch() checks MIN against MAX, for callers of the library too.
  options.nnodes(number(text.substr(colon + 1))).min_nnodes(number(text.substr(0, colon)));
}

}  // namespace

void add_launch_command(CLI::App& app, const std::vector<std::string>& command, int& exit_code) {
  auto* cmd = app.add_subcommand(
      "launch",
      "Start N ranks of PROGRAM on this node, or on every host of a hostfile over ssh, with "
      "torchrun's environment (RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR "
      "MASTER_PORT). Usage: shardtrain launch --nproc N [options] -- PROGRAM ARGS..., or "
      "shardtrain launch --hostfile FILE [options] -- PROGRAM ARGS...");
  // Every value an option writes into lives in `a`, which the callback owns (see ckpt_command).
  struct LaunchArgs {
    LaunchOptions options;
    int nproc = 0;
    std::string nnodes = "1";
    double kill_seconds = 10.0;
    double timeout = 0;
    bool no_prefix = false;
    std::string master_addr;
    HostfileLaunch hosts;
    std::string hostfile, include, exclude;
  };
  auto a = std::make_shared<LaunchArgs>();
  LaunchOptions* options = &a->options;
  cmd->add_option("--nproc,--nproc-per-node", a->nproc,
                  "Ranks to start on this node (with --hostfile: on each host; default there: "
                  "its slots)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--nnodes", a->nnodes,
                  "Number of nodes in the job, or MIN:MAX for an elastic job that goes on with "
                  "as few as MIN nodes when nodes are lost (see --timeout)")
      ->capture_default_str();
  cmd->add_option("--node-rank", options->node_rank_,
                  "Index of this node; its ranks are node_rank*nproc .. +nproc-1")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--master-addr", a->master_addr,
                  "Address of the node hosting rank 0 (default: 127.0.0.1; with --hostfile, its "
                  "first host)");
  cmd->add_option("--master-port", options->master_port_,
                  "Port of the rendezvous store (default: a free port on one node; required with "
                  "--nnodes > 1, where node 0's launcher hosts the launchers' store there; 29500 "
                  "with --hostfile)")
      ->check(CLI::Range(1, 65535));
  cmd->add_option("--iface", options->interface_,
                  "Network interface the ranks communicate over (GLOO_SOCKET_IFNAME, and "
                  "NCCL_SOCKET_IFNAME unless set; default: the hostname's address, or the route "
                  "to --master-addr when the hostname is loopback)");
  cmd->add_option("--max-restarts", options->max_restarts_,
                  "Restart the ranks (of every node) up to R times after a failure")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_flag("--fault-tolerance", options->fault_tolerance_,
                "Restart a failed replica alone while the others train on (each restart "
                "counts against --max-restarts; node 0's launcher hosts the ranks' store, each "
                "node's restarts its own replicas); for ranks that run run.fault_tolerance = "
                "\"replicas\"");
  cmd->add_option("--kill-timeout", a->kill_seconds,
                  "Seconds the other ranks get after SIGTERM before SIGKILL, once one failed")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--timeout", a->timeout,
                  "Seconds a rank's rendezvous or collective waits for the others before failing "
                  "(SHARDTRAIN_TIMEOUT for every rank; shardtrain train's run.timeout, default "
                  "1800), and a node's launcher for the other nodes' launchers (with "
                  "--nnodes MIN:MAX: for a lost node to come back before the job goes on "
                  "without it)")
      ->check(CLI::Range(0.001, 1e9));
  cmd->add_flag("--no-prefix", a->no_prefix, "Relay rank output without the '[rank N] ' prefix");
  cmd->add_option("--hostfile", a->hostfile,
                  "Start a launcher on every host of FILE (DeepSpeed's format: 'HOST slots=N' "
                  "lines) over ssh, in this working directory; hosts are nodes 0, 1, .. in the "
                  "file's order");
  cmd->add_option("--include", a->include,
                  "With --hostfile: only these hosts or slots, as DeepSpeed writes them "
                  "('host1@host2:0,1')");
  cmd->add_option("--exclude", a->exclude,
                  "With --hostfile: all but these hosts or slots ('host1@host2:0,1')");
  cmd->add_option("--ssh", a->hosts.ssh,
                  "With --hostfile: the ssh command, run by /bin/sh with the host and the remote "
                  "command appended")
      ->capture_default_str();
  cmd->add_option("--label", options->label_,
                  "This node's name in line prefixes ('[LABEL:rank N] ') and in the other nodes' "
                  "messages (set by --hostfile to the host)");
  cmd->add_flag("--stop-on-stdin-eof", options->stop_on_stdin_eof_,
                "Stop every rank when stdin ends (set by --hostfile: how a launcher started "
                "over ssh learns that the one that started it stopped)");
  cmd->footer(
      "Exit status: 0 when every rank exited 0, else the failed rank's status (with --hostfile: "
      "the failed host's launcher's; 255 when ssh could not reach it).");
  cmd->callback([a, &command, &exit_code] {
    a->options.kill_timeout(
        std::chrono::milliseconds(static_cast<int64_t>(a->kill_seconds * 1000)));
    a->options.prefix_output(!a->no_prefix);
    if (std::isnan(a->timeout)) {
      throw std::invalid_argument("--timeout must be a number of seconds, got nan");
    }
    if (a->timeout > 0) {
      setenv("SHARDTRAIN_TIMEOUT", std::to_string(a->timeout).c_str(), 1);
    } else if (const char* inherited = std::getenv("SHARDTRAIN_TIMEOUT")) {
      a->timeout = std::atof(inherited);  // a launcher started by --hostfile
    }
    if (a->timeout > 0) {
      a->options.timeout(std::chrono::milliseconds(static_cast<int64_t>(a->timeout * 1000)));
    }
    a->options.nproc_ = a->nproc;
    parse_nnodes(a->nnodes, a->options);
    LaunchResult result;
    if (!a->hostfile.empty()) {
      if (a->options.nnodes_ != 1 || a->options.min_nnodes_ != 0 || a->options.node_rank_ != 0) {
        throw std::invalid_argument(
            "--hostfile sets --nnodes and --node-rank itself (one node per host)");
      }
      a->options.master_addr_ = a->master_addr;
      a->hosts.hosts = select_hosts(read_hostfile(a->hostfile), a->include, a->exclude);
      result = launch_hosts(a->hosts, a->options, command);
    } else {
      if (!a->include.empty() || !a->exclude.empty()) {
        throw std::invalid_argument("--include and --exclude select hosts of a --hostfile");
      }
      if (a->nproc == 0) throw std::invalid_argument("--nproc is required (or --hostfile)");
      if (!a->master_addr.empty()) a->options.master_addr_ = a->master_addr;
      result = launch(a->options, command);
    }
    if (result.exit_code != 0) {
      std::cerr << "shardtrain launch: " << result.message << "\n";
      exit_code = result.exit_code;
    }
  });
}

}  // namespace shardtrain::cli
