// `shardtrain launch --fault-tolerance`: the launcher hosts the ranks' store and publishes which
// ranks train (comm/replica_world.h); a failed replica is restarted alone while the others go
// on, and is taken in again once all its ranks are ready.
#include <sys/wait.h>

#include <algorithm>
#include <stdexcept>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/join.h"
#include "comm/launch_children.h"
#include "comm/replica_world.h"

namespace shardtrain::detail {
namespace {

void publish(c10d::Store& store, int64_t epoch, const std::vector<int>& members) {
  store.set(replica_keys::members(epoch), store_value(join_ranks(members)));
  store.set(replica_keys::epoch(), store_value(std::to_string(epoch)));  // after its members
}

// Ranks per replica as the ranks declared them; 0 before any did.
int replica_size(c10d::Store& store) {
  if (!store.check({replica_keys::replica_size()})) return 0;
  const std::vector<uint8_t> value = store.get(replica_keys::replica_size());
  return std::stoi(std::string(value.begin(), value.end()));
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

}  // namespace

LaunchResult launch_replicas(const LaunchOptions& o, const std::vector<std::string>& command,
                             StopRequests& stop) {
  const int port = o.master_port_ ? o.master_port_ : free_port(false);
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<uint16_t>(port);
  store_options.isServer = true;
  store_options.waitWorkers = false;
  store_options.timeout = o.timeout_;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(o.master_addr_, store_options);
  } catch (const std::exception& e) {
    throw std::runtime_error("could not host the job's store at " + o.master_addr_ + ":" +
                             std::to_string(port) + ": " + e.what());
  }
  const int world = o.nproc_;
  std::vector<int> members(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) members[static_cast<size_t>(r)] = r;
  int64_t epoch = 0;
  publish(*store, epoch, members);

  auto spawn = [&](int rank, int restart) {
    return spawn_rank(o, 0, 1, rank, port, 0, command, -1,
                      {{kReplicaRestartVariable, std::to_string(restart)}});
  };
  std::vector<Child> children;
  for (int r = 0; r < world; ++r) children.push_back(spawn(r, 0));
  std::vector<bool> finished(static_cast<size_t>(world), false);  // exited 0
  std::map<int, int> restarts;                                    // per replica
  std::map<int, int> joining;  // replica -> its restart, waiting for its ranks to be ready
  LaunchResult result;
  auto end_all = [&](int exit_code, int failed_rank, const std::string& message) {
    stop_all(children, o.kill_timeout_);
    drain(children);
    result.exit_code = exit_code;
    result.failed_rank = failed_rank;
    result.message = message;
    return result;
  };

  for (;;) {
    pump(children, 50);
    if (stop.requested())
      return end_all(stop.exit_code(), -1, stop.reason() + "; stopped all ranks");
    for (int i = 0; i < world; ++i) {
      Child& child = children[static_cast<size_t>(i)];
      int status = 0;
      if (!child.running || waitpid(child.pid, &status, WNOHANG) != child.pid) continue;
      child.running = false;
      child.status = status;
      const std::string what =
          child.name + " (pid " + std::to_string(child.pid) + ") " + describe_status(status);
      if (!failed(status)) {
        finished[static_cast<size_t>(i)] = true;
        continue;
      }
      const int code = exit_code_of(status);
      if (code == 2) {
        return end_all(code, i,
                       what +
                           "; stopped the other ranks; not restarted: status 2 is bad input, "
                           "which a restart cannot mend");
      }
      const int size = replica_size(*store);
      if (size == 0) {
        return end_all(code, i,
                       what +
                           " before the ranks said how many make a replica (run.fault_tolerance "
                           "= \"replicas\" in their config?); stopped the other ranks");
      }
      const int replica = i / size;
      if (restarts[replica] >= o.max_restarts_) {
        return end_all(code, i,
                       what + "; stopped the other ranks (replica " + std::to_string(replica) +
                           " failed after " + std::to_string(restarts[replica]) +
                           " restarts of --max-restarts " + std::to_string(o.max_restarts_) + ")");
      }
      const int restart = ++restarts[replica];
      ++result.restarts;
      std::vector<int> ranks;
      for (int r = replica * size; r < (replica + 1) * size; ++r) ranks.push_back(r);
      // The others learn of it first, then the replica's other ranks are stopped (their grace
      // is no wait of the replicas that train on).
      const size_t before = members.size();
      members.erase(std::remove_if(members.begin(), members.end(),
                                   [&](int r) { return r / size == replica; }),
                    members.end());
      if (members.empty()) return end_all(code, i, what + "; no replica is left training");
      if (members.size() != before) publish(*store, ++epoch, members);
      stop_some(children, ranks, o.kill_timeout_);
      write_all(STDERR_FILENO,
                "shardtrain launch: " + what + "; restarting replica " + std::to_string(replica) +
                    " (ranks " + join_ranks(ranks) + ") alone (" + std::to_string(restart) +
                    " of " + std::to_string(o.max_restarts_) + "); the other replicas train on\n");
      for (int r : ranks) {
        children[static_cast<size_t>(r)] = spawn(r, restart);
        finished[static_cast<size_t>(r)] = false;
      }
      joining[replica] = restart;
    }
    // A restarted replica whose ranks are all ready is taken in by a new membership.
    const int size = joining.empty() ? 0 : replica_size(*store);
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
    const bool all_done = std::all_of(members.begin(), members.end(),
                                      [&](int r) { return finished[static_cast<size_t>(r)]; });
    if (all_done) {
      if (any_running(children)) stop_all(children, o.kill_timeout_);
      drain(children);
      return result;
    }
  }
}

}  // namespace shardtrain::detail
