// Replica fault tolerance (run.fault_tolerance = "replicas" under `shardtrain launch
// --fault-tolerance`): the job's replicas train on when one fails, and a replica the launcher
// restarted takes the training state from a healthy one at a step boundary.
//
// Who decides what: the launcher hosts the job's store and publishes each membership (an
// epoch: which ranks train) when a replica fails or a restarted one is ready. The ranks adopt
// a membership only at a step boundary, and only one that every member agreed on: after each
// step's body every member records in the store whether it finished; the step stands once every
// member has, and is taken again by the members of the newer membership when one was published
// before that (a member failed). The first rank to see either outcome writes it, with the
// membership the next step runs on, and every rank reads the same decision. The data's
// collectives run over a Gloo group per membership.
#pragma once

#include <chrono>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "shardtrain/dist.h"
#include "shardtrain/rendezvous.h"

namespace shardtrain {

// The store keys the launcher and the ranks share.
namespace replica_keys {
std::string epoch();                          // the latest membership's number, as text
std::string members(int64_t epoch);           // its ranks, "0,1,3"
std::string replica_size();                   // ranks per replica, as the ranks declared it
std::string ready(int replica, int restart);  // counts a restarted replica's ranks ready to join
}  // namespace replica_keys

// The environment variable `shardtrain launch --fault-tolerance` sets for its ranks: how often
// this rank's replica was restarted (0 on the first start).
inline constexpr const char* kReplicaRestartVariable = "SHARDTRAIN_REPLICA_RESTART";

// How long a rank whose collective failed waits for the launcher to report a replica lost
// before it takes the failure for its own (finish_step(), member_lost()).
inline constexpr std::chrono::seconds kReplicaLossWait{30};

// "0,1,3" back to {0, 1, 3}; throws std::runtime_error naming `what` when malformed.
std::vector<int> parse_ranks(const std::string& text, const std::string& what);

class ReplicaWorld : public std::enable_shared_from_this<ReplicaWorld> {
 public:
  // Connects to the launcher's store; a rank of a replica that was not restarted takes part in
  // the first membership (every rank) at once. `replica_size`: ranks per replica. Throws
  // std::invalid_argument when the environment is not a fault-tolerant launcher's.
  static std::shared_ptr<ReplicaWorld> connect(const RendezvousInfo& info, int replica_size,
                                               ProcessGroupOptions options);
  ~ReplicaWorld();

  // Every rank of the job, numbered as launched; its collectives run over the current members.
  // A rank that has not joined yet (restarted) runs them alone, as if every rank held what it
  // holds: its state is replaced when it joins.
  std::shared_ptr<ProcessGroup> world();

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int replicas() const { return world_size_ / replica_size_; }
  // Replicas in the membership training now.
  int replicas_now() const;
  // This rank's replica was restarted and joins a job that is running.
  bool restarted() const { return restart_ > 0; }
  int restart() const { return restart_; }

  // A restarted rank: says it is ready and waits until a membership that takes its replica in
  // is adopted; the next begin_step() joins it. Returns the step the members take next (past
  // train.steps when they have finished). Blocks (up to the timeout).
  int64_t join();
  // Before a step's body, on every member: adopts the membership decided for this step.
  // Returns the rank this rank copies the training state from (the one at its position in a
  // replica holding it) when it took in replicas that were not in the previous one, else -1. Throws
  // std::runtime_error when a member is lost while the membership's group connects (the step then
  // fails as any other).
  int begin_step(int64_t step);
  // After the body (`finished`: it ran without a communication error): whether the step stands.
  // When it does not, the body runs again on the next membership. A rank whose body failed and
  // that sees no new membership within `limit` gets std::runtime_error.
  bool finish_step(int64_t step, bool finished, std::chrono::milliseconds limit);
  // After a collective outside a step failed (a save): whether the launcher leaves a member of
  // the membership the next step runs on out within `limit`. That step then fails on the
  // given-up group and is taken again without it, as finish_step() decides.
  bool member_lost(std::chrono::milliseconds limit);

  // Ranks per replica: 1 under ddp, a shard group's under fsdp hybrid_shard (rank r is in
  // replica r / replica_size()).
  int replica_size() const { return replica_size_; }

  // A group of some of the ranks that follows the replicas: one replica's ranks (hybrid_shard's
  // shard group) or ranks of several replicas at the same position in each (its replicate
  // group). Every rank of it registers it, in the same order as the others; it is connected
  // now when this rank trains, and again over the members of each membership adopted after.
  // Returns its number for current(). Throws std::invalid_argument for ranks that are neither.
  int add_subgroup(const std::vector<int>& ranks);

  // The group of the current members (`subgroup` -1) or of a registered subgroup's ranks among
  // them, those ranks, and whether this rank is alone (not joined yet). For ElasticGroup.
  struct Current {
    std::shared_ptr<ProcessGroup> group;
    std::vector<int> members;
    bool alone = true;
  };
  Current current(int subgroup = -1) const;
  // Gives up the current members' group and its subgroups after a collective failed: they are
  // closed, which makes the peers still waiting in them fail too, instead of at their timeout.
  void abandon();

 private:
  ReplicaWorld(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size, int replica_size,
               int restart, ProcessGroupOptions options);
  int64_t latest_epoch();
  std::vector<int> members_of(int64_t epoch);
  // Whether a membership after `epoch`, up to `latest`, left out one of its ranks.
  bool lost_since(int64_t epoch, int64_t latest);
  // Connects the group of `epoch`'s members, then the subgroups; throws when a newer one
  // appears first.
  void adopt(int64_t epoch);

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_ = 0;
  int world_size_ = 1;
  int replica_size_ = 1;
  int restart_ = 0;
  ProcessGroupOptions options_;

  mutable std::mutex mutex_;
  int64_t epoch_ = -1;  // adopted; -1: none yet
  std::vector<int> members_;
  std::shared_ptr<ProcessGroup> group_;
  struct Subgroup {
    std::vector<int> ranks;               // as registered
    std::shared_ptr<ProcessGroup> group;  // over those of them that are members now
    std::vector<int> members;
  };
  std::vector<Subgroup> subgroups_;
  // Groups given up, being closed.
  std::vector<std::future<void>> closing_;
  // The ranks holding the trained state: the members of the membership whose step last stood
  // (every rank at the start; none for a restarted rank until it has finished a step).
  std::vector<int> holders_;
  int64_t next_epoch_ = 0;  // the membership the next step runs on
  int heal_from_ = -1;      // for the next adoption: the rank holding the state
  std::map<int64_t, std::vector<int>> memberships_;  // read from the store
};

}  // namespace shardtrain
