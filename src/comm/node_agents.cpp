#include "comm/node_agents.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/join.h"
#include "comm/launch_children.h"
#include "shardtrain/rendezvous.h"

namespace shardtrain::detail {
namespace {

constexpr std::chrono::milliseconds kPoll{100};
// A launcher beats twice a second; node 0 calls a node lost after kHeartbeatLimit without one
// (or the launchers' timeout, when that is shorter, but never under 2 s).
constexpr std::chrono::milliseconds kBeat{500};
constexpr std::chrono::milliseconds kHeartbeatLimit{5000};

std::vector<int> parse_nodes(const std::string& list) {
  std::vector<int> nodes;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) nodes.push_back(std::stoi(item));
  return nodes;
}

bool contains(const std::vector<int>& nodes, int node) {
  return std::find(nodes.begin(), nodes.end(), node) != nodes.end();
}

}  // namespace

struct NodeAgents::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  // The heartbeat's own connection and thread (a store client serves one thread at a time),
  // shared with the thread: a beat blocked on a lost network is left to the process's exit.
  struct Beat {
    c10::intrusive_ptr<c10d::Store> store;
    std::atomic<bool> quit{false}, done{false};
  };
  std::shared_ptr<Beat> beat = std::make_shared<Beat>();
  std::thread beater;
  // Node 0: each node's last heartbeat count and when it last changed.
  std::map<int, std::pair<int64_t, std::chrono::steady_clock::time_point>> beats;
  std::chrono::milliseconds heartbeat_limit{kHeartbeatLimit};
  ~Impl() {
    if (!beater.joinable()) return;
    beat->quit.store(true);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (!beat->done.load() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (beat->done.load()) {
      beater.join();
    } else {
      beater.detach();  // stuck in a round trip to a node that is gone
    }
  }
  static std::string key(const std::string& what) { return "shardtrain/launch/" + what; }
  static std::string key(int attempt, const std::string& what) {
    return key(std::to_string(attempt) + "/" + what);
  }
};

template <typename F>
auto NodeAgents::store(F&& operation) {
  try {
    return operation(*impl_->store);
  } catch (const std::exception& e) {
    throw std::runtime_error("lost contact with node 0's launcher at " + endpoint_ + ": " +
                             first_line(e.what()));
  }
}

NodeAgents::NodeAgents(const std::string& master_addr, int master_port, int nnodes, int min_nodes,
                       int node_rank, std::string label, const std::string& settings,
                       std::chrono::milliseconds timeout, std::function<bool()> stop)
    : impl_(std::make_unique<Impl>()),
      nnodes_(nnodes),
      min_nodes_(min_nodes),
      node_rank_(node_rank),
      label_(std::move(label)),
      timeout_(timeout),
      stop_(std::move(stop)),
      endpoint_(master_addr + ":" + std::to_string(master_port)) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(master_port);
  options.isServer = node_rank == 0;
  options.waitWorkers = false;  // wait_for_nodes names the nodes that are missing
  options.timeout = std::min(timeout, std::chrono::milliseconds(30000));
  try {
    impl_->store = c10::make_intrusive<c10d::TCPStore>(master_addr, options);
  } catch (const std::exception& e) {
    throw std::runtime_error(
        (node_rank == 0 ? "node 0's launcher could not host the launchers' store at " + endpoint_
                        : "node " + std::to_string(node_rank) +
                              "'s launcher could not reach node 0's launcher at " + endpoint_ +
                              " (is it running, with the same --master-addr and --master-port?)") +
        ": " + first_line(e.what()));
  }
  const std::string settings_key = Impl::key("settings");
  if (node_rank == 0) {
    store([&](c10d::Store& s) { s.set(settings_key, store_value(settings)); });
  } else {
    const std::string theirs =
        store([&](c10d::Store& s) { return store_text(s.get(settings_key)); });
    if (theirs != settings) {
      const std::string refusal = "node " + std::to_string(node_rank) + "'s launcher runs " +
                                  settings + " but node 0's runs " + theirs +
                                  ": start every node's launcher with the same options";
      store([&](c10d::Store& s) { s.set(Impl::key("refused"), store_value(refusal)); });
      throw std::invalid_argument(refusal);
    }
  }
  // How node 0 names this node when it is lost: its label and the address it reaches node 0 from.
  const std::string address = transport_address(master_addr, master_port).hostname;
  // Whether the job already runs, asked before this node counts as started: once it does, node 0
  // may publish the first attempt, which this node must not take for a running job.
  const bool job_running =
      node_rank != 0 && store([&](c10d::Store& s) { return s.check({Impl::key("attempt")}); });
  store([&](c10d::Store& s) {
    s.set(Impl::key("address/" + std::to_string(node_rank)), store_value(address));
    s.set(Impl::key("node/" + std::to_string(node_rank)), store_value(label_));
  });
  impl_->heartbeat_limit =
      std::max(std::chrono::milliseconds(2000), std::min(kHeartbeatLimit, timeout_));
  c10d::TCPStoreOptions client = options;
  client.isServer = false;
  impl_->beat->store = c10::make_intrusive<c10d::TCPStore>(master_addr, client);
  impl_->beater =
      std::thread([beat = impl_->beat, key = Impl::key("beat/" + std::to_string(node_rank))] {
        while (!beat->quit.load()) {
          try {
            beat->store->add(key, 1);
          } catch (const std::exception&) {
            // Node 0 is gone: the main thread's next round trip says so.
          }
          for (auto slept = std::chrono::milliseconds(0); slept < kBeat && !beat->quit.load();
               slept += kPoll) {
            std::this_thread::sleep_for(kPoll);
          }
        }
        beat->done.store(true);
      });

  // A launcher started again while its job runs on without it (elastic) joins at a restart.
  if (job_running) {
    wait_to_be_taken_in();
    return;
  }
  std::vector<int> all(static_cast<size_t>(nnodes_));
  for (int node = 0; node < nnodes_; ++node) all[node] = node;
  const std::vector<int> joined = wait_for_nodes(all, Impl::key("node/"), "start a launcher",
                                                 timeout_, /*allow_fewer=*/min_nodes_ < nnodes_);
  if (node_rank == 0) {
    publish_members(0, joined);
    members_ = joined;
    return;
  }
  members_ = published_members(0, timeout_);
  if (!contains(members_, node_rank_)) wait_to_be_taken_in();  // came as node 0 gave up waiting
}

NodeAgents::~NodeAgents() = default;  // Impl's destructor stops the heartbeat

int NodeAgents::index() const {
  const auto it = std::find(members_.begin(), members_.end(), node_rank_);
  return it == members_.end() ? -1 : static_cast<int>(it - members_.begin());
}

std::vector<int> NodeAgents::wait_for_nodes(const std::vector<int>& nodes,
                                            const std::string& prefix, const std::string& doing,
                                            std::chrono::milliseconds timeout, bool allow_fewer) {
  std::vector<std::string> keys;
  for (int node : nodes) keys.push_back(prefix + std::to_string(node));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!store([&](c10d::Store& s) { return s.check(keys); })) {
    if (store([&](c10d::Store& s) { return s.check({Impl::key("refused")}); })) {
      throw std::invalid_argument(
          store([&](c10d::Store& s) { return store_text(s.get(Impl::key("refused"))); }));
    }
    if (stop_()) throw std::runtime_error("stopped while waiting for the other nodes to " + doing);
    if (std::chrono::steady_clock::now() > deadline) {
      std::vector<int> present, missing;
      for (size_t i = 0; i < nodes.size(); ++i) {
        const bool here = store([&](c10d::Store& s) { return s.check({keys[i]}); });
        (here ? present : missing).push_back(nodes[i]);
      }
      if (allow_fewer && static_cast<int>(present.size()) >= min_nodes_) return present;
      throw std::runtime_error(
          "node(s) " + join_ranks(missing) + " did not " + doing + " within " +
          format_seconds(timeout) + " s (launchers' store at " + endpoint_ + ")" +
          (allow_fewer ? "; " + std::to_string(present.size()) + " node(s) are fewer than the " +
                             std::to_string(min_nodes_) + " --nnodes MIN:MAX requires"
                       : std::string()));
    }
    std::this_thread::sleep_for(kPoll);
  }
  return nodes;
}

void NodeAgents::publish_members(int attempt, const std::vector<int>& nodes) {
  store([&](c10d::Store& s) {
    s.set(Impl::key(attempt, "members"), store_value(join_ranks(nodes)));
    s.set(Impl::key("attempt"), store_value(std::to_string(attempt)));
  });
}

std::vector<int> NodeAgents::published_members(int attempt, std::chrono::milliseconds timeout) {
  return parse_nodes(
      node_zero_value(Impl::key(attempt, "members"),
                      "say which nodes take part in attempt " + std::to_string(attempt), timeout));
}

void NodeAgents::wait_to_be_taken_in() {
  first_attempt_ = -1;
  const auto current = [&] {
    return std::stoi(
        store([&](c10d::Store& s) { return store_text(s.get(Impl::key("attempt"))); }));
  };
  int seen = current();
  store([&](c10d::Store& s) {
    s.set(Impl::key("waiting/" + std::to_string(node_rank_)), store_value(label_));
  });
  std::fprintf(stderr,
               "shardtrain launch: node %d joins a job that is running on other nodes; it is "
               "taken in at the job's next restart\n",
               node_rank_);
  for (;;) {
    if (store([&](c10d::Store& s) { return s.check({Impl::key("done")}); })) return;
    const int attempt = current();
    if (attempt > seen) {
      const std::vector<int> members = published_members(attempt, timeout_);
      if (contains(members, node_rank_)) {
        members_ = members;
        first_attempt_ = attempt;
        return;
      }
      seen = attempt;
    }
    if (stop_()) throw std::runtime_error("stopped while waiting to be taken into the job");
    std::this_thread::sleep_for(kPoll);
  }
}

std::optional<NodeFailure> NodeAgents::lost_node() {
  if (node_rank_ != 0) return std::nullopt;
  const auto now = std::chrono::steady_clock::now();
  for (int node : members_) {
    if (node == 0) continue;
    const int64_t count =
        store([&](c10d::Store& s) { return s.add(Impl::key("beat/" + std::to_string(node)), 0); });
    auto found = impl_->beats.find(node);
    if (found == impl_->beats.end() || found->second.first != count) {
      impl_->beats[node] = {count, now};
      continue;
    }
    if (now - found->second.second < impl_->heartbeat_limit) continue;
    const std::string label = store([&](c10d::Store& s) {
      return store_text(s.get(Impl::key("node/" + std::to_string(node))));
    });
    const std::string address = store([&](c10d::Store& s) {
      return store_text(s.get(Impl::key("address/" + std::to_string(node))));
    });
    impl_->beats.erase(node);  // a node taken in again later starts afresh
    return NodeFailure{1, true,
                       "node " + std::to_string(node) + " (" + label + " at " + address +
                           "): its launcher's heartbeat stopped " +
                           format_seconds(impl_->heartbeat_limit) +
                           " s ago (the node or its network was lost)"};
  }
  return std::nullopt;
}

int NodeAgents::rank_port(int attempt) {
  const std::string key = Impl::key(attempt, "port");
  if (node_rank_ == 0) {
    const std::string port = std::to_string(free_port(true));
    store([&](c10d::Store& s) { s.set(key, store_value(port)); });
  }
  return std::stoi(node_zero_value(key, "start attempt " + std::to_string(attempt), timeout_));
}

std::string NodeAgents::node_zero_value(const std::string& key, const std::string& doing,
                                        std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!store([&](c10d::Store& s) { return s.check({key}); })) {
    if (stop_()) throw std::runtime_error("stopped while waiting for node 0's launcher");
    if (std::chrono::steady_clock::now() > deadline) {
      throw std::runtime_error("node 0's launcher did not " + doing + " within " +
                               format_seconds(timeout) + " s");
    }
    std::this_thread::sleep_for(kPoll);
  }
  return store([&](c10d::Store& s) { return store_text(s.get(key)); });
}

void NodeAgents::report_failure(int attempt, NodeFailure failure) {
  store([&](c10d::Store& s) {
    s.set(Impl::key(attempt, "seen/" + std::to_string(node_rank_)), std::vector<uint8_t>{});
    if (s.add(Impl::key(attempt, "failures"), 1) != 1) return;  // another node was first
    s.set(
        Impl::key(attempt, "failed"),
        store_value(std::to_string(failure.exit_code) + " " + (failure.restartable ? "1" : "0") +
                    " node " + std::to_string(node_rank_) + " (" + label_ + "): " + failure.what));
  });
}

std::optional<NodeFailure> NodeAgents::failure(int attempt) {
  // Node 0 reports a node whose heartbeat stopped as the attempt's failure (unless another was
  // reported first), before any collective times out.
  if (auto lost = lost_node()) report_failure(attempt, *lost);
  const std::string key = Impl::key(attempt, "failed");
  const auto record = store([&](c10d::Store& s) -> std::optional<std::string> {
    if (!s.check({key})) return std::nullopt;
    s.set(Impl::key(attempt, "seen/" + std::to_string(node_rank_)), std::vector<uint8_t>{});
    return store_text(s.get(key));
  });
  if (!record) return std::nullopt;
  // "<exit code> <restartable> <what>"
  const size_t first = record->find(' ');
  const size_t second = record->find(' ', first + 1);
  return NodeFailure{std::stoi(record->substr(0, first)),
                     record->substr(first + 1, second - first - 1) == "1",
                     record->substr(second + 1)};
}

std::optional<NodeFailure> NodeAgents::finish(int attempt) {
  store([&](c10d::Store& s) { s.add(Impl::key(attempt, "finished"), 1); });
  for (;;) {
    if (auto failed = failure(attempt)) return failed;
    if (store([&](c10d::Store& s) { return s.add(Impl::key(attempt, "finished"), 0); }) >=
        static_cast<int64_t>(members_.size())) {
      store([&](c10d::Store& s) {
        s.set(Impl::key(attempt, "left/" + std::to_string(node_rank_)), std::vector<uint8_t>{});
      });
      return std::nullopt;
    }
    if (stop_()) return NodeFailure{1, false, "stopped while the other nodes still ran"};
    std::this_thread::sleep_for(kPoll);
  }
}

void NodeAgents::wait_stopped(int attempt) {
  store([&](c10d::Store& s) {
    s.set(Impl::key(attempt, "stopped/" + std::to_string(node_rank_)), std::vector<uint8_t>{});
  });
  if (node_rank_ != 0) {
    // Node 0 decides who takes part next, after up to the timeout for a node that is gone.
    const std::vector<int> next =
        published_members(attempt + 1, timeout_ + std::chrono::milliseconds(30000));
    if (!contains(next, node_rank_)) {
      throw std::runtime_error("node " + std::to_string(node_rank_) +
                               " came back for the restart after the other nodes went on "
                               "without it; start its launcher again to join at the next one");
    }
    members_ = next;
    return;
  }
  std::vector<int> next = wait_for_nodes(members_, Impl::key(attempt, "stopped/"),
                                         "stop its ranks and come back for the restart", timeout_,
                                         /*allow_fewer=*/min_nodes_ < nnodes_);
  // Nodes whose launchers joined while the attempt ran are taken in now.
  for (int node = 0; node < nnodes_; ++node) {
    const std::string waiting = Impl::key("waiting/" + std::to_string(node));
    if (!contains(next, node) && store([&](c10d::Store& s) { return s.check({waiting}); })) {
      store([&](c10d::Store& s) { s.deleteKey(waiting); });
      next.push_back(node);
    }
  }
  std::sort(next.begin(), next.end());
  publish_members(attempt + 1, next);
  members_ = next;
}

void NodeAgents::leave(int attempt, bool succeeded) {
  if (node_rank_ != 0) return;
  try {
    // A launcher waiting to be taken in learns that the job is over.
    store([&](c10d::Store& s) { s.set(Impl::key("done"), std::vector<uint8_t>{}); });
    // After a success the others may still be reading the finished count; after a failure,
    // the failure itself (each marks it seen).
    wait_for_nodes(members_, Impl::key(attempt, succeeded ? "left/" : "seen/"), "leave",
                   std::min(timeout_, std::chrono::milliseconds(succeeded ? 10000 : 2000)));
  } catch (const std::exception&) {
    // The job is over either way; a node that is gone cannot be waited for.
  }
}

}  // namespace shardtrain::detail
