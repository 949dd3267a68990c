// What the replica fault-tolerance tests read from a run's metrics.jsonl, and what every
// fault-injected run must show there (one node's replicas and two hosts' alike).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>

namespace shardtrain::testing {

// One rank's line of one step.
struct ReplicaLine {
  int64_t pid = 0;
  int replicas = 0;
  bool degraded = false;
  int64_t crc = 0;
  double loss = 0;
};

// metrics.jsonl by (step, rank); fails the test on a (step, rank) written twice.
inline std::map<std::pair<int64_t, int>, ReplicaLine> replica_metrics(
    const std::filesystem::path& file) {
  std::map<std::pair<int64_t, int>, ReplicaLine> out;
  std::ifstream in(file);
  for (std::string text; std::getline(in, text);) {
    const auto j = nlohmann::json::parse(text);
    const std::pair<int64_t, int> key{j.at("step").get<int64_t>(), j.at("rank").get<int>()};
    EXPECT_EQ(out.count(key), 0u) << "step " << key.first << " rank " << key.second << " twice";
    out[key] = ReplicaLine{j.at("pid").get<int64_t>(), j.at("replicas").get<int>(),
                           j.value("degraded", false), j.at("state_crc32").get<int64_t>(),
                           j.at("loss").get<double>()};
  }
  return out;
}

// The healthy replicas' processes took every step, the restarted one's lines come from new
// processes, steps after the failure ran degraded until it rejoined, and from the last step's
// state on every replica is the same (each rank's as its peer's at the same position in replica
// 0: replicas of `replica_size` ranks).
inline void expect_healed(const std::map<std::pair<int64_t, int>, ReplicaLine>& lines, int ranks,
                          int steps, int failed_rank, int replica_size = 1) {
  const int replicas = ranks / replica_size;
  std::map<int, std::set<int64_t>> pids;
  int degraded = 0;
  for (const auto& [key, line] : lines) {
    pids[key.second].insert(line.pid);
    if (key.second == 0) degraded += line.degraded ? 1 : 0;
    EXPECT_EQ(line.degraded, line.replicas < replicas) << "step " << key.first;
  }
  for (int r = 0; r < ranks; ++r) {
    if (r / replica_size == failed_rank / replica_size) {
      EXPECT_GE(pids[r].size(), 2u) << "rank " << r << " was not restarted";
    } else {
      EXPECT_EQ(pids[r].size(), 1u) << "rank " << r << " was restarted";
      for (int64_t step = 1; step <= steps; ++step) {
        EXPECT_EQ(lines.count({step, r}), 1u) << "rank " << r << " has no step " << step;
      }
    }
  }
  EXPECT_GT(degraded, 0) << "no step ran without the failed replica";
  // The last step ran on every replica, each with the same state.
  for (int r = 0; r < ranks; ++r) {
    ASSERT_EQ(lines.count({steps, r}), 1u) << "rank " << r << " did not take the last step";
    EXPECT_EQ(lines.at({steps, r}).replicas, replicas);
    EXPECT_EQ(lines.at({steps, r}).crc, lines.at({steps, r % replica_size}).crc) << "rank " << r;
  }
}

}  // namespace shardtrain::testing
