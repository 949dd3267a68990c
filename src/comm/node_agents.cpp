#include "comm/node_agents.h"

#include <algorithm>
#include <stdexcept>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/join.h"
#include "comm/launch_children.h"

namespace shardtrain::detail {
namespace {

std::string text(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }
std::vector<uint8_t> bytes(const std::string& value) { return {value.begin(), value.end()}; }
// c10's errors carry a backtrace after their first line.
std::string first_line(const std::string& what) { return what.substr(0, what.find('\n')); }

constexpr std::chrono::milliseconds kPoll{100};

}  // namespace

struct NodeAgents::Impl {
  c10::intrusive_ptr<c10d::Store> store;
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

NodeAgents::NodeAgents(const std::string& master_addr, int master_port, int nnodes, int node_rank,
                       std::string label, const std::string& settings,
                       std::chrono::milliseconds timeout, std::function<bool()> stop)
    : impl_(std::make_unique<Impl>()),
      nnodes_(nnodes),
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
    store([&](c10d::Store& s) { s.set(settings_key, bytes(settings)); });
  } else {
    const std::string theirs = store([&](c10d::Store& s) { return text(s.get(settings_key)); });
    if (theirs != settings) {
      const std::string refusal = "node " + std::to_string(node_rank) + "'s launcher runs " +
                                  settings + " but node 0's runs " + theirs +
                                  ": start every node's launcher with the same options";
      store([&](c10d::Store& s) { s.set(Impl::key("refused"), bytes(refusal)); });
      throw std::invalid_argument(refusal);
    }
  }
  store([&](c10d::Store& s) {
    s.set(Impl::key("node/" + std::to_string(node_rank)), bytes(label_));
  });
  wait_for_nodes(Impl::key("node/"), "start a launcher", timeout_);
}

NodeAgents::~NodeAgents() = default;

void NodeAgents::wait_for_nodes(const std::string& prefix, const std::string& doing,
                                std::chrono::milliseconds timeout) {
  std::vector<std::string> keys;
  for (int node = 0; node < nnodes_; ++node) keys.push_back(prefix + std::to_string(node));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!store([&](c10d::Store& s) { return s.check(keys); })) {
    if (store([&](c10d::Store& s) { return s.check({Impl::key("refused")}); })) {
      throw std::invalid_argument(
          store([&](c10d::Store& s) { return text(s.get(Impl::key("refused"))); }));
    }
    if (stop_()) throw std::runtime_error("stopped while waiting for the other nodes to " + doing);
    if (std::chrono::steady_clock::now() > deadline) {
      std::vector<int> missing;
      for (int node = 0; node < nnodes_; ++node) {
        if (!store([&](c10d::Store& s) { return s.check({keys[node]}); })) missing.push_back(node);
      }
      throw std::runtime_error("node(s) " + join_ranks(missing) + " did not " + doing + " within " +
                               format_seconds(timeout) + " s (launchers' store at " + endpoint_ +
                               ")");
    }
    std::this_thread::sleep_for(kPoll);
  }
}

int NodeAgents::rank_port(int attempt) {
  const std::string key = Impl::key(attempt, "port");
  if (node_rank_ == 0) {
    const std::string port = std::to_string(free_port(true));
    store([&](c10d::Store& s) { s.set(key, bytes(port)); });
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (!store([&](c10d::Store& s) { return s.check({key}); })) {
    if (stop_()) throw std::runtime_error("stopped while waiting for node 0's launcher");
    if (std::chrono::steady_clock::now() > deadline) {
      throw std::runtime_error("node 0's launcher did not start attempt " +
                               std::to_string(attempt) + " within " + format_seconds(timeout_) +
                               " s");
    }
    std::this_thread::sleep_for(kPoll);
  }
  return std::stoi(store([&](c10d::Store& s) { return text(s.get(key)); }));
}

void NodeAgents::report_failure(int attempt, NodeFailure failure) {
  store([&](c10d::Store& s) {
    s.set(Impl::key(attempt, "seen/" + std::to_string(node_rank_)), {});
    if (s.add(Impl::key(attempt, "failures"), 1) != 1) return;  // another node was first
    s.set(Impl::key(attempt, "failed"),
          bytes(std::to_string(failure.exit_code) + " " + (failure.restartable ? "1" : "0") +
                " node " + std::to_string(node_rank_) + " (" + label_ + "): " + failure.what));
  });
}

std::optional<NodeFailure> NodeAgents::failure(int attempt) {
  const std::string key = Impl::key(attempt, "failed");
  const auto record = store([&](c10d::Store& s) -> std::optional<std::string> {
    if (!s.check({key})) return std::nullopt;
    s.set(Impl::key(attempt, "seen/" + std::to_string(node_rank_)), {});
    return text(s.get(key));
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
        nnodes_) {
      store([&](c10d::Store& s) {
        s.set(Impl::key(attempt, "left/" + std::to_string(node_rank_)), {});
      });
      return std::nullopt;
    }
    if (stop_()) return NodeFailure{1, false, "stopped while the other nodes still ran"};
    std::this_thread::sleep_for(kPoll);
  }
}

void NodeAgents::wait_stopped(int attempt) {
  store([&](c10d::Store& s) {
    s.set(Impl::key(attempt, "stopped/" + std::to_string(node_rank_)), {});
  });
  wait_for_nodes(Impl::key(attempt, "stopped/"), "stop its ranks and come back for the restart",
                 timeout_);
}

void NodeAgents::leave(int attempt, bool succeeded) {
  if (node_rank_ != 0) return;
  try {
    // After a success the others may still be reading the finished count; after a failure,
    // the failure itself (each marks it seen).
    wait_for_nodes(Impl::key(attempt, succeeded ? "left/" : "seen/"), "leave",
                   std::min(timeout_, std::chrono::milliseconds(succeeded ? 10000 : 2000)));
  } catch (const std::exception&) {
    // The job is over either way; a node that is gone cannot be waited for.
  }
}

}  // namespace shardtrain::detail
