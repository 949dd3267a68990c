#include "comm/replica_world.h"

#include <algorithm>
#include <cstdlib>
#include <future>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/join.h"
#include "comm/work.h"

namespace shardtrain {
namespace {

const std::string kPrefix = "shardtrain/ft/";

bool contains(const std::vector<int>& ranks, int rank) {
  return std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
}

std::string step_key(int64_t step, int64_t epoch, const char* what) {
  return kPrefix + "step/" + std::to_string(step) + "/" + std::to_string(epoch) + "/" + what;
}
std::string start_key(int64_t epoch) { return kPrefix + "start/" + std::to_string(epoch); }

// The job's ranks, numbered as launched, whose collectives run over the members of the current
// membership (ReplicaWorld::world()), or a subgroup of them (ReplicaWorld::add_subgroup) over
// those of its ranks that are members. With all of its ranks members it is their group itself;
// with replicas missing, averages and maxima are over the members, a sum is the members' scaled
// to every rank (their mean times the group's size), and a broadcast comes from a member; the
// operations that need every rank's slice (gathers, scatters, point-to-point) are refused.
class ElasticGroup : public ProcessGroup {
 public:
  // `subgroup`: -1 for every rank of the job, else ReplicaWorld::add_subgroup's number.
  ElasticGroup(std::shared_ptr<ReplicaWorld> replicas, int subgroup, int rank,
               std::vector<int> global_ranks)
      : ProcessGroup(
            subgroup < 0 ? "replicas" : "replicas/[" + detail::join_ranks(global_ranks) + "]", rank,
            std::move(global_ranks)),
        replicas_(std::move(replicas)),
        subgroup_(subgroup) {}

  Backend backend() const override { return Backend::kGloo; }

  WorkHandle all_reduce(at::Tensor tensor, ReduceOp op) override {
    const ReplicaWorld::Current now = current();
    if (now.alone) {
      if (op == ReduceOp::kSum) tensor.mul_(size());
      return done();
    }
    WorkHandle work = now.group->all_reduce(tensor, op);
    const int members = static_cast<int>(now.members.size());
    if (op != ReduceOp::kSum || members == size()) return work;
    work->wait();
    tensor.mul_(static_cast<double>(size()) / members);
    return done();
  }
  WorkHandle all_gather(at::Tensor input, at::Tensor output) override {
    const ReplicaWorld::Current now = current();
    if (now.alone) {
      output.view({size(), -1}).copy_(input.reshape({1, -1}).expand({size(), -1}));
      return done();
    }
    return whole(now, "all_gather")->all_gather(input, output);
  }
  WorkHandle reduce_scatter(at::Tensor input, at::Tensor output, ReduceOp op) override {
    return whole(current(), "reduce_scatter")->reduce_scatter(input, output, op);
  }
  WorkHandle all_to_all(at::Tensor input, at::Tensor output, std::vector<int64_t> input_splits,
                        std::vector<int64_t> output_splits) override {
    return whole(current(), "all_to_all")
        ->all_to_all(input, output, std::move(input_splits), std::move(output_splits));
  }
  WorkHandle broadcast(at::Tensor tensor, int root) override {
    const ReplicaWorld::Current now = current();
    if (now.alone) return done();
    const int global = global_ranks()[static_cast<size_t>(root)];
    const auto at = std::find(now.members.begin(), now.members.end(), global);
    if (at == now.members.end()) {
      throw std::runtime_error("broadcast from rank " + std::to_string(global) +
                               ", whose replica is not training now");
    }
    return now.group->broadcast(tensor, static_cast<int>(at - now.members.begin()));
  }
  WorkHandle send(at::Tensor tensor, int dst, int tag) override {
    return whole(current(), "send")->send(tensor, dst, tag);
  }
  WorkHandle recv(at::Tensor tensor, int src, int tag) override {
    return whole(current(), "recv")->recv(tensor, src, tag);
  }
  WorkHandle barrier() override {
    const ReplicaWorld::Current now = current();
    return now.alone ? done() : now.group->barrier();
  }
  WorkHandle barrier_within(std::chrono::milliseconds timeout) override {
    const ReplicaWorld::Current now = current();
    return now.alone ? done() : now.group->barrier_within(timeout);
  }
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) override {
    SubgroupPlan plan = plan_subgroup(ranks);
    if (ranks.size() == 1) {
      // A rank on its own needs nobody: a group of one over a store of its own.
      return init_process_group(c10::make_intrusive<c10d::HashStore>(), 0, 1);
    }
    if (static_cast<int>(plan.global_ranks.size()) == replicas_->world_size()) {
      return std::make_shared<ElasticGroup>(replicas_, -1, plan.global_ranks[plan.rank],
                                            all_ranks(replicas_->world_size()));
    }
    const int subgroup = replicas_->add_subgroup(plan.global_ranks);
    return std::make_shared<ElasticGroup>(replicas_, subgroup, plan.rank,
                                          std::move(plan.global_ranks));
  }

  static std::vector<int> all_ranks(int world_size) {
    std::vector<int> ranks(static_cast<size_t>(world_size));
    for (int r = 0; r < world_size; ++r) ranks[static_cast<size_t>(r)] = r;
    return ranks;
  }

 private:
  static WorkHandle done() { return std::make_shared<detail::CompletedWork>(); }
  ReplicaWorld::Current current() const {
    ReplicaWorld::Current now = replicas_->current(subgroup_);
    if (!now.alone && !now.group) {
      throw std::runtime_error(
          "the replicas' group was given up after a failure; the next step connects a new one");
    }
    return now;
  }
  // The members' group when every rank of this group is a member; refused otherwise.
  std::shared_ptr<ProcessGroup> whole(const ReplicaWorld::Current& now, const char* op) const {
    if (!now.alone && static_cast<int>(now.members.size()) == size()) return now.group;
    throw std::runtime_error(std::string(op) + " over the replicas while " +
                             (now.alone ? std::string("this rank has not joined them yet")
                                        : "only ranks " + detail::join_ranks(now.members) + " of " +
                                              detail::join_ranks(global_ranks()) + " train"));
  }

  std::shared_ptr<ReplicaWorld> replicas_;
  int subgroup_ = -1;
};

// The group of `ranks`' members among `members` (the ranks of `group`, a membership's), made
// from `group` on each of them; and those ranks.
std::pair<std::shared_ptr<ProcessGroup>, std::vector<int>> connect_subgroup(
    ProcessGroup& group, const std::vector<int>& members, const std::vector<int>& ranks) {
  std::vector<int> present;
  std::vector<int> indices;
  for (int r : ranks) {
    const auto at = std::find(members.begin(), members.end(), r);
    if (at == members.end()) continue;
    present.push_back(r);
    indices.push_back(static_cast<int>(at - members.begin()));
  }
  if (present.size() == 1) {
    return {init_process_group(c10::make_intrusive<c10d::HashStore>(), 0, 1), present};
  }
  return {group.new_group(indices), present};
}

}  // namespace

namespace replica_keys {
std::string epoch() { return kPrefix + "epoch"; }
std::string members(int64_t epoch) { return kPrefix + "members/" + std::to_string(epoch); }
std::string replica_size() { return kPrefix + "replica_size"; }
std::string ready(int replica, int restart) {
  return kPrefix + "ready/" + std::to_string(replica) + "/" + std::to_string(restart);
}
}  // namespace replica_keys

std::vector<int> parse_ranks(const std::string& value, const std::string& what) {
  std::vector<int> ranks;
  std::stringstream in(value);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      size_t used = 0;
      ranks.push_back(std::stoi(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw std::runtime_error(what + " '" + value + "' is not a list of ranks");
    }
  }
  return ranks;
}

ReplicaWorld::ReplicaWorld(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
                           int replica_size, int restart, ProcessGroupOptions options)
    : store_(std::move(store)),
      rank_(rank),
      world_size_(world_size),
      replica_size_(replica_size),
      restart_(restart),
      options_(std::move(options)) {}

ReplicaWorld::~ReplicaWorld() {
  abandon();
  for (auto& closing : closing_) closing.wait();
}

void ReplicaWorld::abandon() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::shared_ptr<ProcessGroup>> groups;
  if (group_) groups.push_back(std::move(group_));
  // Moved from, each pointer is left null.
  for (auto& subgroup : subgroups_) {
    if (subgroup.group) groups.push_back(std::move(subgroup.group));
  }
  if (groups.empty()) return;
  // Closed on a thread of their own: a worker may still wait in a collective that fails only
  // once a peer closes its side, as this closing does for the peers waiting on this rank.
  closing_.push_back(
      std::async(std::launch::async, [groups = std::move(groups)]() mutable { groups.clear(); }));
}

int ReplicaWorld::add_subgroup(const std::vector<int>& ranks) {
  const auto replica = [this](int r) { return r / replica_size_; };
  const auto position = [this](int r) { return r % replica_size_; };
  bool one_replica = true, one_position = true;
  std::vector<int> replicas_seen;
  for (int r : ranks) {
    one_replica = one_replica && replica(r) == replica(ranks.front());
    one_position = one_position && position(r) == position(ranks.front()) &&
                   !contains(replicas_seen, replica(r));
    replicas_seen.push_back(replica(r));
  }
  if (!one_replica && !one_position) {
    throw std::invalid_argument(
        "run.fault_tolerance = \"replicas\": a group of ranks " + detail::join_ranks(ranks) +
        " is neither one replica's ranks nor one rank of each of several replicas (replicas of " +
        std::to_string(replica_size_) + " rank(s)), so it cannot follow the replicas that train");
  }
  std::unique_lock<std::mutex> lock(mutex_);
  subgroups_.push_back(Subgroup{ranks, nullptr, {}});
  const size_t index = subgroups_.size() - 1;
  if (epoch_ >= 0 && group_) {
    // Training already: its ranks connect it now, as they would any new group.
    const std::shared_ptr<ProcessGroup> group = group_;
    const std::vector<int> members = members_;
    lock.unlock();
    auto connected = connect_subgroup(*group, members, ranks);
    lock.lock();
    subgroups_[index].group = std::move(connected.first);
    subgroups_[index].members = std::move(connected.second);
  }
  return static_cast<int>(index);
}

std::shared_ptr<ReplicaWorld> ReplicaWorld::connect(const RendezvousInfo& info, int replica_size,
                                                    ProcessGroupOptions options) {
  const char* restart = std::getenv(kReplicaRestartVariable);
  if (!restart || info.source != "torchrun") {
    throw std::invalid_argument(
        "run.fault_tolerance = \"replicas\" needs its ranks started by `shardtrain launch "
        "--fault-tolerance`, which hosts the job's store and restarts a failed replica alone (" +
        std::string(kReplicaRestartVariable) + " is not set)");
  }
  if (replica_size < 1 || info.world_size % replica_size != 0 ||
      info.world_size / replica_size < 2) {
    throw std::invalid_argument("run.fault_tolerance = \"replicas\" needs at least 2 replicas; " +
                                std::to_string(info.world_size) + " rank(s) make " +
                                std::to_string(info.world_size / std::max(1, replica_size)));
  }
  options.ranks_per_node(info.local_world_size);
  if (options.hostname_.empty() && options.interface_.empty()) {
    options.hostname(transport_address(info.master_addr, info.master_port).hostname);
  }
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<uint16_t>(info.master_port);
  store_options.isServer = false;  // the launcher hosts it, so that it outlives any rank
  store_options.waitWorkers = false;
  store_options.timeout = options.timeout_;
  auto store = c10::make_intrusive<c10d::TCPStore>(info.master_addr, store_options);
  store->set(replica_keys::replica_size(), detail::store_value(std::to_string(replica_size)));
  std::shared_ptr<ReplicaWorld> world(new ReplicaWorld(std::move(store), info.rank, info.world_size,
                                                       replica_size, std::atoi(restart), options));
  if (!world->restarted()) {
    world->holders_ =
        parse_ranks(detail::store_text(world->store_->get(replica_keys::members(0))), "ranks");
    world->adopt(0);
  }
  return world;
}

std::shared_ptr<ProcessGroup> ReplicaWorld::world() {
  // Made on request and not kept: it keeps this object alive, not the other way round.
  return std::make_shared<ElasticGroup>(shared_from_this(), -1, rank_,
                                        ElasticGroup::all_ranks(world_size_));
}

int ReplicaWorld::replicas_now() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(members_.size()) / replica_size_;
}

ReplicaWorld::Current ReplicaWorld::current(int subgroup) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (subgroup < 0) return Current{group_, members_, epoch_ < 0};
  const Subgroup& s = subgroups_.at(static_cast<size_t>(subgroup));
  return Current{s.group, s.members, epoch_ < 0};
}

int64_t ReplicaWorld::latest_epoch() {
  return std::stoll(detail::store_text(store_->get(replica_keys::epoch())));
}

std::vector<int> ReplicaWorld::members_of(int64_t epoch) {
  // A membership never changes once published.
  auto known = memberships_.find(epoch);
  if (known == memberships_.end()) {
    known = memberships_
                .emplace(epoch,
                         parse_ranks(detail::store_text(store_->get(replica_keys::members(epoch))),
                                     "membership " + std::to_string(epoch)))
                .first;
  }
  return known->second;
}

bool ReplicaWorld::lost_since(int64_t epoch, int64_t latest) {
  // A membership that only took replicas in loses nobody: the step goes on without them.
  const std::vector<int> members = members_of(epoch);
  for (int64_t later = epoch + 1; later <= latest; ++later) {
    const std::vector<int> after = members_of(later);
    for (int r : members) {
      if (!contains(after, r)) return true;
    }
  }
  return false;
}

void ReplicaWorld::adopt(int64_t epoch) {
  const std::vector<int> members = members_of(epoch);
  const auto at = std::find(members.begin(), members.end(), rank_);
  if (at == members.end()) {
    throw std::runtime_error("rank " + std::to_string(rank_) + " is not among the ranks of " +
                             "membership " + std::to_string(epoch) + " (" +
                             detail::join_ranks(members) + "): its replica was taken out");
  }
  const int index = static_cast<int>(at - members.begin());
  const std::string prefix = kPrefix + "group/" + std::to_string(epoch) + "/";
  // Every member says it is here before any connects: a member lost meanwhile shows as a newer
  // membership, which ends the wait instead of the group's timeout.
  store_->set(prefix + "here/" + std::to_string(index), detail::store_value("1"));
  std::vector<std::string> here;
  for (size_t i = 0; i < members.size(); ++i) here.push_back(prefix + "here/" + std::to_string(i));
  const auto deadline = std::chrono::steady_clock::now() + options_.timeout_;
  auto pause = std::chrono::milliseconds(1);
  while (!store_->check(here)) {
    if (lost_since(epoch, latest_epoch())) {
      throw std::runtime_error("a rank of membership " + std::to_string(epoch) +
                               " was lost while its ranks met");
    }
    if (std::chrono::steady_clock::now() > deadline) {
      throw std::runtime_error("the ranks of membership " + std::to_string(epoch) + " (" +
                               detail::join_ranks(members) + ") did not all arrive within " +
                               std::to_string(options_.timeout_.count() / 1000) + " s");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
  auto group = init_process_group(c10::make_intrusive<c10d::PrefixStore>(prefix, store_), index,
                                  static_cast<int>(members.size()), options_);
  // The subgroups over this membership, in the order they were registered (the same on every
  // rank: each connects with its own ranks only).
  std::vector<std::vector<int>> registered;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& subgroup : subgroups_) registered.push_back(subgroup.ranks);
  }
  std::vector<std::pair<std::shared_ptr<ProcessGroup>, std::vector<int>>> connected;
  for (const auto& ranks : registered)
    connected.push_back(connect_subgroup(*group, members, ranks));
  abandon();
  std::lock_guard<std::mutex> lock(mutex_);
  group_ = std::move(group);
  for (size_t i = 0; i < connected.size(); ++i) {
    subgroups_[i].group = std::move(connected[i].first);
    subgroups_[i].members = std::move(connected[i].second);
  }
  members_ = members;
  epoch_ = epoch;
  next_epoch_ = epoch;
}

int64_t ReplicaWorld::join() {
  const int replica = rank_ / replica_size_;
  const int64_t from = latest_epoch();
  store_->add(replica_keys::ready(replica, restart_), 1);
  const auto deadline = std::chrono::steady_clock::now() + options_.timeout_;
  for (auto pause = std::chrono::milliseconds(1);;
       pause = std::min(pause * 2, std::chrono::milliseconds(20))) {
    // The first membership that takes this replica in and that the members adopted.
    const int64_t latest = latest_epoch();
    for (int64_t e = from; e <= latest; ++e) {
      if (!store_->check({start_key(e)}) || !contains(members_of(e), rank_)) continue;
      next_epoch_ = e;
      std::istringstream start(detail::store_text(store_->get(start_key(e))));
      int64_t step = 0;
      start >> heal_from_ >> step;
      return step;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      throw std::runtime_error("rank " + std::to_string(rank_) +
                               " was not taken in by the running replicas within " +
                               std::to_string(options_.timeout_.count() / 1000) + " s");
    }
    std::this_thread::sleep_for(pause);
  }
}

int ReplicaWorld::begin_step(int64_t /*step*/) {
  if (holders_.empty() && heal_from_ < 0) {
    // Taken in by a membership in which no rank holds the trained state (every replica that
    // did failed meanwhile): there is nothing to heal from.
    throw std::runtime_error(
        "rank " + std::to_string(rank_) +
        ": no replica holding the trained state is left to take it from; restart the job from "
        "its latest checkpoint");
  }
  if (next_epoch_ != epoch_) adopt(next_epoch_);
  // The rank at this rank's position in the replica that holds the state.
  const int source =
      heal_from_ < 0 ? -1 : heal_from_ / replica_size_ * replica_size_ + rank_ % replica_size_;
  heal_from_ = -1;
  return source;
}

bool ReplicaWorld::member_lost(std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!lost_since(next_epoch_, latest_epoch())) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

bool ReplicaWorld::finish_step(int64_t step, bool finished, std::chrono::milliseconds limit) {
  // The membership this step ran on (or tried to connect).
  const int64_t epoch = next_epoch_;
  const std::vector<int> members = members_of(epoch);
  const std::string done = step_key(step, epoch, "done");
  const std::string decision = step_key(step, epoch, "decision");
  if (finished) store_->add(done, 1);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  auto pause = std::chrono::microseconds(200);
  while (!store_->check({decision})) {
    const int64_t latest = latest_epoch();
    std::string proposal;
    if (finished && store_->add(done, 0) >= static_cast<int64_t>(members.size())) {
      proposal = "commit " + std::to_string(latest);
    } else if (lost_since(epoch, latest)) {
      proposal = "abort " + std::to_string(latest);
    } else if (!finished && std::chrono::steady_clock::now() > deadline) {
      throw std::runtime_error("step " + std::to_string(step) +
                               " failed on this rank and the launcher reported no replica lost "
                               "within " +
                               std::to_string(limit.count() / 1000) + " s");
    }
    if (!proposal.empty()) {
      store_->compareSet(decision, {}, detail::store_value(proposal));  // the first proposal stands
      break;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(20000));
  }
  std::istringstream read(detail::store_text(store_->get(decision)));
  std::string kind;
  int64_t next = epoch;
  read >> kind >> next;
  const bool stands = kind == "commit";
  if (stands) holders_ = members;
  if (next != epoch) {
    // Who holds the state the newcomers of the next membership take: the first rank that
    // holds the trained state and stays. Only such ranks write it (they agree); a rank that
    // joined and has not finished a step yet reads it.
    if (!holders_.empty()) {
      const std::vector<int> after = members_of(next);
      int source = -1;
      if (std::any_of(after.begin(), after.end(), [&](int r) { return !contains(holders_, r); })) {
        for (int r : holders_) {
          if (contains(after, r)) {
            source = r;
            break;
          }
        }
      }
      const int64_t first_step = stands ? step + 1 : step;
      store_->compareSet(
          start_key(next), {},
          detail::store_value(std::to_string(source) + " " + std::to_string(first_step)));
    }
    std::istringstream start(detail::store_text(store_->get(start_key(next))));
    start >> heal_from_;
  }
  next_epoch_ = next;
  return stands;
}

}  // namespace shardtrain
