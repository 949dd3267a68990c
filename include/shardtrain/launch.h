// Spawns the local ranks of a job with a torchrun-compatible environment and supervises them.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace shardtrain {

struct LaunchOptions {
  LaunchOptions& nproc(int value) {
    nproc_ = value;
    return *this;
  }
  LaunchOptions& nnodes(int value) {
    nnodes_ = value;
    return *this;
  }
  LaunchOptions& node_rank(int value) {
    node_rank_ = value;
    return *this;
  }
  LaunchOptions& master_addr(std::string value) {
    master_addr_ = std::move(value);
    return *this;
  }
  // 0: pick a free port (single node only; several nodes must agree on one).
  LaunchOptions& master_port(int value) {
    master_port_ = value;
    return *this;
  }
  LaunchOptions& max_restarts(int value) {
    max_restarts_ = value;
    return *this;
  }
  // How long ranks get between SIGTERM and SIGKILL once one of them failed.
  LaunchOptions& kill_timeout(std::chrono::milliseconds value) {
    kill_timeout_ = value;
    return *this;
  }
  // Prefix each line a rank prints with "[rank N] ".
  LaunchOptions& prefix_output(bool value) {
    prefix_output_ = value;
    return *this;
  }

  int nproc_ = 1;
  int nnodes_ = 1;
  int node_rank_ = 0;
  std::string master_addr_ = "127.0.0.1";
  int master_port_ = 0;
  int max_restarts_ = 0;
  std::chrono::milliseconds kill_timeout_{std::chrono::seconds(10)};
  bool prefix_output_ = true;
};

struct LaunchResult {
  int exit_code = 0;     // 0 when every rank exited 0
  int failed_rank = -1;  // global rank of the first rank that failed, -1 if none
  int restarts = 0;      // how many times the ranks were restarted
  std::string message;   // one line saying what failed, empty on success
};

// Starts ranks node_rank*nproc .. node_rank*nproc+nproc-1 running `command` with RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT set (and, with nproc > 1,
// OMP_NUM_THREADS = max(1, cores / nproc) unless it is set already), relays their output
// line by line, and waits. When one rank fails (non-zero exit or a signal) the others get
// SIGTERM, then SIGKILL after kill_timeout; with restarts left, all are started again, with
// TORCHELASTIC_RESTART_COUNT = the attempt (0 first) and TORCHELASTIC_MAX_RESTARTS set, unless
// the failed rank exited with status 2 (bad input), which a restart cannot mend.
// Blocking; throws std::invalid_argument for bad options and std::runtime_error when a rank
// cannot be started at all.
LaunchResult launch(const LaunchOptions& options, const std::vector<std::string>& command);

}  // namespace shardtrain
