// `shardtrain launch --fault-tolerance`: node 0's launcher hosts the ranks' store and publishes
// which ranks train (comm/replica_world.h); a failed replica is restarted alone by the launcher
// of its node while the others go on, and is taken in again once all its ranks are ready.
// Launchers of other nodes tell node 0 through the same store: a replica they restart, the ranks
// that finished, a failure that ends the job.
#include <sys/wait.h>

#include <algorithm>
#include <stdexcept>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/join.h"
#include "comm/launch_children.h"
#include "comm/replica_world.h"

namespace shardtrain::detail {
namespace {

// What the launchers tell each other (the ranks read only replica_keys).
namespace launcher_keys {
const std::string kPrefix = "shardtrain/ft/launch/";
// The launcher of `replica`'s node restarts it for the `restart`-th time.
std::string failed(int replica, int restart) {
  return kPrefix + "failed/" + std::to_string(replica) + "/" + std::to_string(restart);
}
std::string finished(int rank) { return kPrefix + "finished/" + std::to_string(rank); }
std::string done() { return kPrefix + "done"; }  // every training rank finished
std::string left(int node) { return kPrefix + "left/" + std::to_string(node); }
std::string abort() { return kPrefix + "abort"; }  // the job ends: why
}  // namespace launcher_keys

void publish(c10d::Store& store, int64_t epoch, const std::vector<int>& members) {
  store.set(replica_keys::members(epoch), store_value(join_ranks(members)));
  store.set(replica_keys::epoch(), store_value(std::to_string(epoch)));  // after its members
}

// Ranks per replica as the ranks declared them; 0 before any did.
int replica_size(c10d::Store& store) {
  if (!store.check({replica_keys::replica_size()})) return 0;
  return std::stoi(store_text(store.get(replica_keys::replica_size())));
}

// Stops the children at `indices` (SIGTERM, SIGKILL after the grace), relaying their output.
void stop_some(std::vector<Child>& children, const std::vector<int>& indices,
               std::chrono::milliseconds grace) {
  std::vector<Child> some;
  for (int i : indices) some.push_back(children[i]);
  stop_all(some, grace);
  drain(some);
  for (size_t k = 0; k < indices.size(); ++k) children[indices[k]] = some[k];
}

c10::intrusive_ptr<c10d::Store> connect_store(const LaunchOptions& o, int port, bool host) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(port);
  options.isServer = host;
  options.waitWorkers = false;
  options.timeout = o.timeout_;
  try {
    return c10::make_intrusive<c10d::TCPStore>(o.master_addr_, options);
  } catch (const std::exception& e) {
    throw std::runtime_error((host ? "could not host the job's store at " : "could not reach ") +
                             std::string(host ? "" : "node 0's store at ") + o.master_addr_ + ":" +
                             std::to_string(port) + ": " + first_line(e.what()));
  }
}

}  // namespace

LaunchResult launch_replicas(const LaunchOptions& o, const std::vector<std::string>& command,
                             StopRequests& stop) {
  const bool coordinator = o.node_rank_ == 0;
  const int port = o.master_port_ ? o.master_port_ : free_port(false);
  const c10::intrusive_ptr<c10d::Store> store = connect_store(o, port, coordinator);
  const int world = o.nnodes_ * o.nproc_;
  const int first = o.node_rank_ * o.nproc_;  // this node's first rank
  const auto here = [&](int rank) { return rank >= first && rank < first + o.nproc_; };
  std::vector<int> members(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) members[static_cast<size_t>(r)] = r;
  int64_t epoch = 0;
  if (coordinator) publish(*store, epoch, members);

  auto spawn = [&](int local, int restart) {
    return spawn_rank(o, o.node_rank_, o.nnodes_, local, port, 0, command, -1,
                      {{kReplicaRestartVariable, std::to_string(restart)}});
  };
  std::vector<Child> children;
  for (int local = 0; local < o.nproc_; ++local) children.push_back(spawn(local, 0));
  std::vector<bool> finished(static_cast<size_t>(o.nproc_), false);  // exited 0
  std::map<int, int> restarts;  // per replica: by this node's launcher, or seen by node 0's
  std::map<int, int> joining;   // replica -> its restart, waiting for its ranks to be ready
  int size = 0;                 // ranks per replica, once the ranks declared it
  LaunchResult result;
  auto end_all = [&](int exit_code, int failed_rank, const std::string& message) {
    stop_all(children, o.kill_timeout_);
    drain(children);
    result.exit_code = exit_code;
    result.failed_rank = failed_rank;
    result.message = message;
    return result;
  };
  // Ends this node and, through the store, every other one.
  auto end_job = [&](int exit_code, int failed_rank, const std::string& message) {
    if (o.nnodes_ > 1) {
      const std::string why = "node " + std::to_string(o.node_rank_) + ": " + message;
      store->compareSet(launcher_keys::abort(), {}, store_value(why));
    }
    return end_all(exit_code, failed_rank, message);
  };
  // Another node's launcher ended the job: its reason.
  auto ended_elsewhere = [&] {
    return end_all(1, -1,
                   store_text(store->get(launcher_keys::abort())) + "; stopped this node's ranks");
  };
  // Node 0 publishes a membership without `replica`; another node's launcher asks it to and
  // waits until it did, so that the replicas training on learn of it before its ranks stop.
  auto drop_replica = [&](int replica, int restart) {
    if (coordinator) {
      const size_t before = members.size();
      members.erase(std::remove_if(members.begin(), members.end(),
                                   [&](int r) { return r / size == replica; }),
                    members.end());
      if (members.size() != before && !members.empty()) publish(*store, ++epoch, members);
      joining[replica] = restart;
      return !members.empty();
    }
    store->set(launcher_keys::failed(replica, restart), store_value("1"));
    const auto deadline = std::chrono::steady_clock::now() + o.timeout_;
    for (;;) {
      if (store->check({launcher_keys::abort()})) return false;
      const int64_t latest = std::stoll(store_text(store->get(replica_keys::epoch())));
      const std::vector<int> now =
          parse_ranks(store_text(store->get(replica_keys::members(latest))), "membership");
      if (std::none_of(now.begin(), now.end(), [&](int r) { return r / size == replica; })) {
        return true;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        throw std::runtime_error("node 0 did not take replica " + std::to_string(replica) +
                                 " out of training within --timeout " + format_seconds(o.timeout_));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  };

  try {
    for (;;) {
      pump(children, 50);
      if (stop.requested()) {
        return end_job(stop.exit_code(), -1, stop.reason() + "; stopped all ranks");
      }
      if (o.nnodes_ > 1 && store->check({launcher_keys::abort()})) return ended_elsewhere();
      if (size == 0 && (size = replica_size(*store)) > 0 && o.nnodes_ > 1 && o.nproc_ % size) {
        return end_job(2, -1,
                       "a replica has " + std::to_string(size) + " ranks, which --nproc " +
                           std::to_string(o.nproc_) +
                           " does not divide: with --fault-tolerance across nodes each replica "
                           "runs on one node, whose launcher restarts it");
      }
      for (int local = 0; local < o.nproc_; ++local) {
        Child& child = children[static_cast<size_t>(local)];
        int status = 0;
        if (!child.running || waitpid(child.pid, &status, WNOHANG) != child.pid) continue;
        child.running = false;
        child.status = status;
        const int rank = first + local;
        const std::string what =
            child.name + " (pid " + std::to_string(child.pid) + ") " + describe_status(status);
        if (!failed(status)) {
          finished[static_cast<size_t>(local)] = true;
          if (!coordinator) store->set(launcher_keys::finished(rank), store_value("1"));
          continue;
        }
        const int code = exit_code_of(status);
        if (code == 2) {
          return end_job(code, rank,
                         what +
                             "; stopped the other ranks; not restarted: status 2 is bad input, "
                             "which a restart cannot mend");
        }
        if (size == 0) {
          return end_job(code, rank,
                         what +
                             " before the ranks said how many make a replica "
                             "(run.fault_tolerance = \"replicas\" in their config?); stopped the "
                             "other ranks");
        }
        const int replica = rank / size;
        if (restarts[replica] >= o.max_restarts_) {
          return end_job(code, rank,
                         what + "; stopped the other ranks (replica " + std::to_string(replica) +
                             " failed after " + std::to_string(restarts[replica]) +
                             " restarts of --max-restarts " + std::to_string(o.max_restarts_) +
                             ")");
        }
        const int restart = ++restarts[replica];
        ++result.restarts;
        if (!drop_replica(replica, restart)) {
          if (!coordinator) return ended_elsewhere();
          return end_job(code, rank, what + "; no replica is left training");
        }
        std::vector<int> ranks, locals;
        for (int r = replica * size; r < (replica + 1) * size; ++r) {
          ranks.push_back(r);
          locals.push_back(r - first);
        }
        stop_some(children, locals, o.kill_timeout_);
        write_all(STDERR_FILENO, "shardtrain launch: " + what + "; restarting replica " +
                                     std::to_string(replica) + " (ranks " + join_ranks(ranks) +
                                     ") alone (" + std::to_string(restart) + " of " +
                                     std::to_string(o.max_restarts_) +
                                     "); the other replicas train on\n");
        for (int local_rank : locals) {
          children[static_cast<size_t>(local_rank)] = spawn(local_rank, restart);
          finished[static_cast<size_t>(local_rank)] = false;
          if (!coordinator) store->deleteKey(launcher_keys::finished(first + local_rank));
        }
      }
      if (!coordinator) {
        if (!store->check({launcher_keys::done()})) continue;
        // Every rank that trains finished; a replica still joining here has nothing to add.
        if (any_running(children)) stop_all(children, o.kill_timeout_);
        drain(children);
        store->set(launcher_keys::left(o.node_rank_), store_value("1"));
        return result;
      }
      // Node 0: the replicas other nodes restart leave the training first.
      if (size > 0 && o.nnodes_ > 1) {
        for (int replica = o.nproc_ / size; replica < world / size; ++replica) {
          const int restart = restarts[replica] + 1;
          if (!store->check({launcher_keys::failed(replica, restart)})) continue;
          restarts[replica] = restart;
          if (!drop_replica(replica, restart)) {
            return end_job(
                1, replica * size,
                "replica " + std::to_string(replica) + " failed; no replica is left training");
          }
        }
      }
      // A restarted replica whose ranks are all ready is taken in by a new membership.
      for (auto it = joining.begin(); it != joining.end();) {
        if (store->add(replica_keys::ready(it->first, it->second), 0) < size) {
          ++it;
          continue;
        }
        for (int r = it->first * size; r < (it->first + 1) * size; ++r) members.push_back(r);
        std::sort(members.begin(), members.end());
        publish(*store, ++epoch, members);
        it = joining.erase(it);
      }
      // Done when every rank that trains exited 0; a replica still joining has nothing to add.
      const bool all_done = std::all_of(members.begin(), members.end(), [&](int r) {
        return here(r) ? finished[static_cast<size_t>(r - first)]
                       : store->check({launcher_keys::finished(r)});
      });
      if (all_done) {
        if (any_running(children)) stop_all(children, o.kill_timeout_);
        drain(children);
        // The store lives here: the other launchers read that the job is done before it goes.
        store->set(launcher_keys::done(), store_value("1"));
        std::vector<std::string> others;
        for (int node = 1; node < o.nnodes_; ++node) others.push_back(launcher_keys::left(node));
        if (!others.empty()) {
          try {
            store->wait(others, o.timeout_);
          } catch (const std::exception&) {
            // A launcher that is gone has nothing to read.
          }
        }
        return result;
      }
    }
  } catch (const std::exception& e) {
    // The store went with node 0, or node 0 did not answer in time.
    return end_all(1, -1, std::string(first_line(e.what())) + "; stopped this node's ranks");
  }
}

}  // namespace shardtrain::detail
