#include "shardtrain/launch.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <thread>

#include "comm/join.h"
#include "comm/launch_children.h"
#include "comm/node_agents.h"

namespace shardtrain {
namespace {

using detail::Child;

// Threads each of `nproc` ranks can have without the ranks oversubscribing the cores this
// launcher may run on.
int threads_per_rank(int nproc) {
  cpu_set_t cores;
  const int available = sched_getaffinity(0, sizeof cores, &cores) == 0
                            ? CPU_COUNT(&cores)
                            : static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, available / nproc);
}

// Where this node's ranks sit in an attempt: its index among the nodes taking part, and their
// number (elastic jobs renumber the nodes that remain).
struct NodePlace {
  int index = 0;
  int nodes = 1;
};

}  // namespace

namespace detail {

Child spawn_rank(const LaunchOptions& o, int node_index, int nodes, int local_rank, int port,
                 int attempt, const std::vector<std::string>& command, int stdin_fd,
                 const std::map<std::string, std::string>& extra) {
  const NodePlace place{node_index, nodes};
  const int rank = place.index * o.nproc_ + local_rank;
  std::map<std::string, std::string> env = extra;
  env.insert({
      {"RANK", std::to_string(rank)},
      {"WORLD_SIZE", std::to_string(place.nodes * o.nproc_)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(o.nproc_)},
      {"GROUP_RANK", std::to_string(place.index)},
      {"MASTER_ADDR", o.master_addr_},
      {"MASTER_PORT", std::to_string(port)},
      // torchrun's names: a restarted trainer resumes from its latest checkpoint.
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(attempt)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts_)},
  });
  // Unless the user chose, the ranks share the cores instead of each taking all of them
  // (LibTorch's intra-op pool and OpenBLAS both read this).
  if (o.nproc_ > 1 && !std::getenv("OMP_NUM_THREADS")) {
    env["OMP_NUM_THREADS"] = std::to_string(threads_per_rank(o.nproc_));
  }
  if (!o.interface_.empty()) {
    env["GLOO_SOCKET_IFNAME"] = o.interface_;
    if (!std::getenv("NCCL_SOCKET_IFNAME")) env["NCCL_SOCKET_IFNAME"] = o.interface_;
  }
  const std::string name = "rank " + std::to_string(rank);
  std::string tag;
  if (o.prefix_output_) tag = "[" + (o.label_.empty() ? "" : o.label_ + ":") + name + "] ";
  return detail::spawn_child(command, detail::environment_with(env), name, tag, stdin_fd);
}

}  // namespace detail

namespace {

Child spawn_rank(const LaunchOptions& o, const NodePlace& place, int local_rank, int port,
                 int attempt, const std::vector<std::string>& command, int stdin_fd) {
  return detail::spawn_rank(o, place.index, place.nodes, local_rank, port, attempt, command,
                            stdin_fd, {});
}

// --nnodes as given: "N", or "MIN:MAX" for an elastic job.
std::string nnodes_text(const LaunchOptions& o) {
  return o.min_nnodes_ != 0 && o.min_nnodes_ != o.nnodes_
             ? std::to_string(o.min_nnodes_) + ":" + std::to_string(o.nnodes_)
             : std::to_string(o.nnodes_);
}

void validate(const LaunchOptions& o, const std::vector<std::string>& command) {
  if (command.empty()) throw std::invalid_argument("no program to launch (give it after --)");
  if (o.nproc_ < 1) throw std::invalid_argument("--nproc must be at least 1");
  if (o.nnodes_ < 1) throw std::invalid_argument("--nnodes must be at least 1");
  if (o.min_nnodes_ != 0 && (o.min_nnodes_ < 1 || o.min_nnodes_ > o.nnodes_)) {
    const std::string min = std::to_string(o.min_nnodes_), max = std::to_string(o.nnodes_);
    throw std::invalid_argument(
        "--nnodes " + nnodes_text(o) + ": MIN (" + min + ") is " +
        (o.min_nnodes_ < 1 ? "below 1" : "above MAX (" + max + ")") +
        ": MIN is the fewest nodes the job goes on with, MAX the most it runs on");
  }
  if (o.node_rank_ < 0 || o.node_rank_ >= o.nnodes_) {
    throw std::invalid_argument("--node-rank " + std::to_string(o.node_rank_) +
                                " is not below --nnodes " + std::to_string(o.nnodes_));
  }
  if (o.nnodes_ > 1 && o.master_port_ == 0) {
    throw std::invalid_argument("--master-port is required with --nnodes > 1");
  }
  if (o.master_port_ < 0 || o.master_port_ > 65535) {
    throw std::invalid_argument("--master-port " + std::to_string(o.master_port_) +
                                " is not a TCP port");
  }
  if (o.max_restarts_ < 0) throw std::invalid_argument("--max-restarts must be >= 0");
  if (o.fault_tolerance_ && o.min_nnodes_ != 0 && o.min_nnodes_ != o.nnodes_) {
    throw std::invalid_argument(
        "--fault-tolerance with --nnodes " + nnodes_text(o) +
        ": replicas heal within a job of fixed nodes (each node's launcher restarts its own "
        "replicas); an elastic job restarts from its latest checkpoint instead: choose one");
  }
  detail::check_interface(o.interface_);
}

// How an attempt ended on this node.
struct Attempt {
  int failed = -1;                          // index of the local rank that failed first
  std::optional<detail::NodeFailure> peer;  // a failure another node reported first
  bool stopped = false;                     // this launcher was asked to stop
};

std::string node_rank_failure(const Child& child) {
  return child.name + " (pid " + std::to_string(child.pid) + ") " +
         detail::describe_status(child.status);
}

// Runs the attempt until every rank exited, one failed, another node reported a failure, or a
// stop was asked for; in the last three cases the ranks are stopped. A failure of this node is
// reported to the others before its ranks are stopped, so theirs stop at the same time.
Attempt supervise(std::vector<Child>& children, const LaunchOptions& o, detail::NodeAgents* agents,
                  int attempt, detail::StopRequests& stop) {
  Attempt a;
  auto next_check = std::chrono::steady_clock::now();
  while (detail::any_running(children) && a.failed < 0 && !a.peer && !a.stopped) {
    detail::pump(children, 50);
    a.failed = detail::reap(children);
    a.stopped = a.failed < 0 && stop.requested();
    const auto now = std::chrono::steady_clock::now();
    if (agents && a.failed < 0 && !a.stopped && now >= next_check) {
      try {
        a.peer = agents->failure(attempt);
      } catch (const std::runtime_error& e) {
        a.peer = detail::NodeFailure{1, false, e.what()};  // node 0's launcher is gone
      }
      next_check = now + std::chrono::milliseconds(250);
    }
  }
  if (agents && (a.failed >= 0 || a.stopped)) {
    detail::NodeFailure failure;
    if (a.failed >= 0) {
      const Child& child = children[a.failed];
      failure = {detail::exit_code_of(child.status), true, node_rank_failure(child)};
      // Status 2 is bad input (a config key, a file, a flag): the same command fails again.
      failure.restartable = failure.exit_code != 2;
    } else {
      failure = {stop.exit_code(), false, "its launcher was " + stop.reason()};
    }
    try {
      agents->report_failure(attempt, failure);
    } catch (const std::exception&) {
      // Node 0 is gone: the other nodes learn of it from losing it too.
    }
  }
  if (a.failed >= 0 || a.peer || a.stopped) detail::stop_all(children, o.kill_timeout_);
  detail::drain(children);
  return a;
}

// What every node's launcher must run alike.
std::string shared_settings(const LaunchOptions& o) {
  return "--nproc " + std::to_string(o.nproc_) + " --nnodes " + nnodes_text(o) +
         " --max-restarts " + std::to_string(o.max_restarts_);
}

std::unique_ptr<detail::NodeAgents> join_nodes(const LaunchOptions& o, detail::StopRequests& stop) {
  if (o.nnodes_ == 1) return nullptr;
  std::string label = o.label_;
  if (label.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    label = host;
  }
  return std::make_unique<detail::NodeAgents>(
      o.master_addr_, o.master_port_, o.nnodes_, o.min_nnodes_ > 0 ? o.min_nnodes_ : o.nnodes_,
      o.node_rank_, label, shared_settings(o), o.timeout_, [&stop] { return stop.requested(); });
}

}  // namespace

LaunchResult launch(const LaunchOptions& options, const std::vector<std::string>& command) {
  validate(options, command);
  detail::StopRequests stop(options.stop_on_stdin_eof_);
  if (options.fault_tolerance_) return detail::launch_replicas(options, command, stop);
  const std::unique_ptr<detail::NodeAgents> agents = join_nodes(options, stop);
  // A launcher that stops when its input ends gives its ranks none.
  const int rank_stdin = options.stop_on_stdin_eof_ ? open("/dev/null", O_RDONLY | O_CLOEXEC) : -1;

  LaunchResult result;
  int attempt = agents ? agents->first_attempt() : 0;
  if (attempt < 0) {
    // Joined a running job, which ended before a restart took this node in (never node 0,
    // which hosts the job: nothing to leave).
    result.message = "the job ended before a restart took this node in";
    if (rank_stdin >= 0) close(rank_stdin);
    return result;
  }
  try {
    for (;; ++attempt) {
      result = LaunchResult{0, -1, attempt, ""};
      const int port = agents                 ? agents->rank_port(attempt)
                       : options.master_port_ ? options.master_port_
                                              : detail::free_port(false);
      const NodePlace place =
          agents ? NodePlace{agents->index(), static_cast<int>(agents->members().size())}
                 : NodePlace{0, 1};
      std::vector<Child> children;
      for (int local = 0; local < options.nproc_; ++local) {
        children.push_back(spawn_rank(options, place, local, port, attempt, command, rank_stdin));
      }
      Attempt a = supervise(children, options, agents.get(), attempt, stop);
      if (a.stopped) {
        result.exit_code = stop.exit_code();
        result.message = stop.reason() + "; stopped all ranks";
        break;
      }
      if (a.failed < 0 && !a.peer && agents) a.peer = agents->finish(attempt);
      if (a.failed < 0 && !a.peer) break;  // every rank of every node exited 0
      // Every node acts on the first failure reported, so that all decide alike.
      std::optional<detail::NodeFailure> first = a.peer;
      if (agents && (!first || first->restartable)) first = agents->failure(attempt);
      if (a.failed >= 0) {
        const Child& child = children[a.failed];
        result.failed_rank = place.index * options.nproc_ + a.failed;
        result.exit_code = detail::exit_code_of(child.status);
        result.message = node_rank_failure(child) + "; stopped the other ranks";
        if (!first) first = detail::NodeFailure{result.exit_code, result.exit_code != 2, ""};
      } else {
        result.exit_code = first->exit_code == 0 ? 1 : first->exit_code;
        result.message = first->what + "; stopped this node's ranks";
      }
      if (attempt >= options.max_restarts_) {
        if (options.max_restarts_ > 0) {
          result.message += " (after " + std::to_string(attempt) + " restarts)";
        }
        break;
      }
      if (!first->restartable) {
        result.message +=
            first->exit_code == 2
                ? "; not restarted: status 2 is bad input, which a restart cannot mend"
                : "; not restarted: the launcher was asked to stop";
        break;
      }
      std::string nodes;
      if (agents) {
        const std::vector<int> before = agents->members();
        agents->wait_stopped(attempt);
        if (agents->members() != before) {
          const size_t n = agents->members().size();
          nodes = " on " + std::to_string(n) + (n == 1 ? " node (" : " nodes (") +
                  detail::join_ranks(agents->members()) + ") of --nnodes " + nnodes_text(options);
        }
      }
      detail::write_all(STDERR_FILENO, "shardtrain launch: " + result.message + "; restarting" +
                                           nodes + " (" + std::to_string(attempt + 1) + " of " +
                                           std::to_string(options.max_restarts_) + ")\n");
    }
  } catch (const std::runtime_error& e) {
    // The other nodes' launchers were lost, did not come back, or the wait was stopped.
    result.exit_code = result.exit_code ? result.exit_code : 1;
    result.message += (result.message.empty() ? "" : "; not restarted: ") + std::string(e.what());
  }
  if (agents) agents->leave(attempt, result.exit_code == 0);
  if (rank_stdin >= 0) close(rank_stdin);
  return result;
}

}  // namespace shardtrain
