// The launchers of a multi-node job agree through a TCP store that node 0's launcher hosts at
// --master-addr:--master-port, as torchrun's agents do: they join (checking that they run the
// same settings), learn the port rank 0 hosts the ranks' store on, hear of a failure on any node,
// and wait for each other before a restart.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

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
  // Joins the launchers of all `nnodes` nodes. `label` is how the others name this node;
  // `settings` must be the same on every node (node 0's wins; another is refused with both
  // named). Waits poll `stop` and end early when it says so; store round trips give up after
  // `timeout` or 30 s, whichever is shorter. Throws naming the nodes that did not join.
  NodeAgents(const std::string& master_addr, int master_port, int nnodes, int node_rank,
             std::string label, const std::string& settings, std::chrono::milliseconds timeout,
             std::function<bool()> stop);
  ~NodeAgents();

  // The port rank 0 hosts its store on in `attempt`: node 0 picks a free one, the others wait
  // for it.
  int rank_port(int attempt);
  // This node failed in `attempt`; the first report of an attempt is the one every node acts on.
  void report_failure(int attempt, NodeFailure failure);
  // The first failure reported in `attempt`, if any (one round trip to node 0).
  std::optional<NodeFailure> failure(int attempt);
  // This node's ranks all exited 0: waits until every node's did (nullopt) or one failed (that
  // failure). Ends with a failure of this node too when `stop` asks.
  std::optional<NodeFailure> finish(int attempt);
  // This node stopped its ranks after a failure: waits until every node did, so that the next
  // attempt starts together; throws naming the nodes that did not within the timeout.
  void wait_stopped(int attempt);
  // The last thing a launcher does. Node 0 hosts the store, so it waits until the others have
  // what they need: briefly after a failure (they read it within a poll), longer after a success.
  void leave(int attempt, bool succeeded);

 private:
  // Waits until keys prefix+"0" .. prefix+(nnodes-1) exist; throws naming the nodes missing.
  void wait_for_nodes(const std::string& prefix, const std::string& doing,
                      std::chrono::milliseconds timeout);
  // Runs a store operation; a lost store becomes one line naming node 0's launcher.
  template <typename F>
  auto store(F&& operation);

  struct Impl;
  std::unique_ptr<Impl> impl_;
  int nnodes_;
  int node_rank_;
  std::string label_;
  std::chrono::milliseconds timeout_;
  std::function<bool()> stop_;
  std::string endpoint_;
};

}  // namespace shardtrain::detail
