// The launchers of a multi-node job agree through a TCP store that node 0's launcher hosts at
// --master-addr:--master-port, as torchrun's agents do: they join (checking that they run the
// same settings), learn the port rank 0 hosts the ranks' store on, hear of a failure on any node,
// and wait for each other before a restart. Each launcher beats a heartbeat into the store from a
// thread of its own; node 0's notices a node whose heartbeat stopped within seconds. An elastic
// job (fewer than all nodes allowed, --nnodes MIN:MAX) goes on without a node that does not come
// back for a restart, and takes a returning node in at the next restart.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace shardtrain::detail {

// How an attempt failed on some node: the launcher's exit status for it, what happened (naming
// the node), and whether a restart may mend it (not bad input, not a stop the user asked for).
struct NodeFailure {
  int exit_code = 1;
  bool restartable = true;
  std::string what;
};

class NodeAgents {
 public:
  // Joins the launchers of up to `nnodes` nodes: all of them, or, when `min_nodes` is lower, at
  // least `min_nodes` once the timeout has passed. `label` is how the others name this node;
  // `settings` must be the same on every node (node 0's wins; another is refused with both
  // named). Waits poll `stop` and end early when it says so; store round trips give up after
  // `timeout` or 30 s, whichever is shorter. Throws naming the nodes that did not join. A
  // launcher that joins a job already running waits until a restart takes it in
  // (first_attempt()).
  NodeAgents(const std::string& master_addr, int master_port, int nnodes, int min_nodes,
             int node_rank, std::string label, const std::string& settings,
             std::chrono::milliseconds timeout, std::function<bool()> stop);
  ~NodeAgents();

  // The nodes of the current attempt (their --node-rank, ascending): this node's place among
  // them is its node index for the attempt (its ranks are index*nproc ..), their count the
  // attempt's number of nodes.
  const std::vector<int>& members() const { return members_; }
  int index() const;
  // The attempt this launcher starts with: 0, or for a launcher that joined a running job the
  // restart that took it in; -1 when the job ended before one did.
  int first_attempt() const { return first_attempt_; }

  // The port rank 0 hosts its store on in `attempt`: node 0 picks a free one, the others wait
  // for it.
  int rank_port(int attempt);
  // This node failed in `attempt`; the first report of an attempt is the one every node acts on.
  void report_failure(int attempt, NodeFailure failure);
  // The first failure reported in `attempt`, if any (one round trip to node 0). On node 0 a
  // node of the attempt whose launcher's heartbeat stopped is reported first, as a failure
  // naming it.
  std::optional<NodeFailure> failure(int attempt);
  // This node's ranks all exited 0: waits until every node's did (nullopt) or one failed (that
  // failure). Ends with a failure of this node too when `stop` asks.
  std::optional<NodeFailure> finish(int attempt);
  // This node stopped its ranks after a failure: waits until every node of the attempt did, so
  // that the next attempt starts together, and makes members() the next attempt's. Throws
  // naming the nodes that did not come back within the timeout, unless the job is elastic and
  // enough nodes did: it then goes on without them (and with any node that joined meanwhile).
  void wait_stopped(int attempt);
  // The last thing a launcher does. Node 0 hosts the store, so it waits until the others have
  // what they need: briefly after a failure (they read it within a poll), longer after a success.
  void leave(int attempt, bool succeeded);

 private:
  // Waits until keys prefix+N exist for every node N of `nodes`; returns them. At the timeout,
  // returns those present when `allow_fewer` and they are at least min_nodes; else throws
  // naming the nodes missing.
  std::vector<int> wait_for_nodes(const std::vector<int>& nodes, const std::string& prefix,
                                  const std::string& doing, std::chrono::milliseconds timeout,
                                  bool allow_fewer = false);
  // Waits up to `timeout` for node 0's launcher to set `key` and returns its value; throws
  // "node 0's launcher did not <doing> within ..." past it.
  std::string node_zero_value(const std::string& key, const std::string& doing,
                              std::chrono::milliseconds timeout);
  // Waits for the members node 0 published for `attempt` and returns them.
  std::vector<int> published_members(int attempt, std::chrono::milliseconds timeout);
  // Node 0: publishes `nodes` as the members of `attempt`.
  void publish_members(int attempt, const std::vector<int>& nodes);
  // A launcher that joined while the job ran: waits for a restart that takes it in.
  void wait_to_be_taken_in();
  // Node 0: a node of the attempt whose launcher's heartbeat stopped (lost with its machine or
  // its network), as a failure naming it; nullopt on the other nodes and while all beat.
  std::optional<NodeFailure> lost_node();
  // Runs a store operation; a lost store becomes one line naming node 0's launcher.
  template <typename F>
  auto store(F&& operation);

  struct Impl;
  std::unique_ptr<Impl> impl_;
  int nnodes_;
  int min_nodes_;
  int node_rank_;
  std::vector<int> members_;
  int first_attempt_ = 0;
  std::string label_;
  std::chrono::milliseconds timeout_;
  std::function<bool()> stop_;
  std::string endpoint_;
};

}  // namespace shardtrain::detail
