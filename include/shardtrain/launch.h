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
  // Elastic: the job goes on with as few as `value` nodes (torchrun's --nnodes MIN:MAX, with
  // nnodes the MAX). A node that does not come back for a restart within the timeout is left
  // out while at least MIN remain; a launcher started again for it joins at the next restart.
  // 0: nnodes (not elastic).
  LaunchOptions& min_nnodes(int value) {
    min_nnodes_ = value;
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

  // The network interface the ranks' transport uses (GLOO_SOCKET_IFNAME, and
  // NCCL_SOCKET_IFNAME unless set); empty: chosen as rendezvous.h's transport_address says.
  LaunchOptions& interface(std::string value) {
    interface_ = std::move(value);
    return *this;
  }
  // With several nodes: how long a launcher waits for the others to join, and to come back
  // for a restart, before it ends the job naming the nodes missing.
  LaunchOptions& timeout(std::chrono::milliseconds value) {
    timeout_ = value;
    return *this;
  }
  // The node's name in line prefixes ("[label:rank N] ") and in the other nodes' messages.
  LaunchOptions& label(std::string value) {
    label_ = std::move(value);
    return *this;
  }
  // Stop every rank when stdin ends: how a launcher started over ssh learns that the launcher
  // that started it stopped (ssh without a terminal passes no signal, only the end of input).
  LaunchOptions& stop_on_stdin_eof(bool value) {
    stop_on_stdin_eof_ = value;
    return *this;
  }

  // Replica fault tolerance: node 0's launcher hosts the ranks' store, and when a rank fails
  // only the ranks of its replica are stopped and started again by their node's launcher (each
  // time counting against max_restarts) while the other replicas train on; the ranks must run
  // run.fault_tolerance = "replicas", which says how many ranks a replica has.
  LaunchOptions& fault_tolerance(bool value) {
    fault_tolerance_ = value;
    return *this;
  }

  int nproc_ = 1;
  int nnodes_ = 1;
  int min_nnodes_ = 0;
  int node_rank_ = 0;
  std::string master_addr_ = "127.0.0.1";
  int master_port_ = 0;
  int max_restarts_ = 0;
  std::chrono::milliseconds kill_timeout_{std::chrono::seconds(10)};
  bool prefix_output_ = true;
  std::string interface_;
  std::chrono::milliseconds timeout_{std::chrono::seconds(1800)};
  std::string label_;
  bool stop_on_stdin_eof_ = false;
  bool fault_tolerance_ = false;
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
// With nnodes > 1 the launchers of all nodes meet in a TCP store node 0's launcher hosts at
// master_addr:master_port: node 0 picks the port rank 0 hosts the ranks' store on (MASTER_PORT),
// a failure on any node stops the ranks of every node, and a restart starts them on every node
// together; a node that does not join, or come back for a restart, within `timeout` ends the job
// with a message naming it (elastic, min_nnodes: the job goes on without it while at least
// min_nnodes nodes remain, the ranks numbered over the nodes that take part, WORLD_SIZE their
// ranks). Each launcher beats a heartbeat into node 0's store; a node whose heartbeat stops for
// 5 s (the timeout, if shorter; at least 2 s) is reported as a failure of the attempt.
// With fault_tolerance, see LaunchOptions::fault_tolerance: the job ends when the ranks of
// every replica that trains exited 0, and fails when a replica failed more than max_restarts
// times, when every replica failed at once, or when a rank exited with status 2.
// Blocking; throws std::invalid_argument for bad options and std::runtime_error when a rank
// cannot be started at all.
LaunchResult launch(const LaunchOptions& options, const std::vector<std::string>& command);

// A host of a hostfile in DeepSpeed's format ("node1 slots=4") and the slots of it a job uses.
struct HostSlots {
  std::string host;
  std::vector<int> slots;  // slot indices: 0 .. slots-1 unless --include/--exclude chose
};

// Reads a hostfile: one "HOST slots=N" per line; blank lines and '#' comments ignored.
// Throws std::invalid_argument naming the file and line of what is wrong.
std::vector<HostSlots> read_hostfile(const std::string& path);

// DeepSpeed's --include / --exclude: "host1@host2:0,2" keeps (or drops) whole hosts, or the
// listed slots of a host. At most one of the two may be given. Throws std::invalid_argument
// for a host or slot the hostfile does not have, or when no slot is left.
std::vector<HostSlots> select_hosts(std::vector<HostSlots> hosts, const std::string& include,
                                    const std::string& exclude);

// `word` quoted for /bin/sh: 'it'\''s' for it's.
std::string shell_quoted(const std::string& word);

struct HostfileLaunch {
  std::vector<HostSlots> hosts;
  // The ssh command, run by /bin/sh with the host and the remote command appended.
  std::string ssh = "ssh";
};

// Starts one launcher per host over ssh (node k = the k-th host; master_addr, when empty, the
// first host; master_port 0 means 29500), with `options` (nproc 0: every host's slot count,
// which must then be the same on every host) and the same working directory and program. Lines
// come back prefixed "[host:rank N] ". When one host's launcher fails, or on SIGINT/SIGTERM,
// every host's launcher is told to stop (its input is closed) and the ssh sessions end.
// Exit status: 0, or that of the first host's launcher that failed (ssh's 255 when the host
// could not be reached).
LaunchResult launch_hosts(const HostfileLaunch& hosts, LaunchOptions options,
                          const std::vector<std::string>& command);

}  // namespace shardtrain
