// Replica fault tolerance, by fault injection as torchft's tests do: `shardtrain launch
// --fault-tolerance` runs DDP replicas; a replica killed mid-run is restarted alone while the
// others train on without stopping, rejoins at a step boundary and takes a healthy replica's
// state, after which every replica's state is the same bit for bit.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "shardtrain/train.h"
#include "support.h"

namespace shardtrain {
namespace replica_test {

namespace fs = std::filesystem;

struct Line {
  int64_t pid = 0;
  int replicas = 0;
  bool degraded = false;
  int64_t crc = 0;
  double loss = 0;
};

class ReplicaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::fresh_test_dir("shardtrain_replicas");
    std::ofstream corpus(dir_ / "corpus.txt");
    for (int i = 0; i < 300; ++i) corpus << "pack my box with five dozen " << i % 11 << " jugs.\n";
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string config(const std::string& extra = "") const {
    const std::string path = (dir_ / "run.toml").string();
    std::ofstream(path) << "[model]\npreset = \"tiny\"\n[data]\ncorpus = \""
                        << (dir_ / "corpus.txt").string() << "\"\nseq_len = 32\n[train]\n"
                        << "steps = 400\nmicro_batch = 2\nsample_tokens = 0\n"
                        << "[parallel]\nstrategy = \"ddp\"\n[run]\nthreads = 1\n"
                        << "fault_tolerance = \"replicas\"\ntimeout = 60\nlog_every = 100\n"
                        << extra;
    return path;
  }

  testing::CommandResult launch(const std::string& env, int ranks, int restarts,
                                const std::string& settings = "") const {
    return testing::run_command(
        env + " " + testing::cli() + " launch --fault-tolerance --nproc " + std::to_string(ranks) +
        " --max-restarts " + std::to_string(restarts) + " --kill-timeout 2 -- " + testing::cli() +
        " train --config " + config() + " --set run.dir=" + (dir_ / "run").string() + settings);
  }

  // metrics.jsonl by (step, rank); fails the test on a (step, rank) written twice.
  std::map<std::pair<int64_t, int>, Line> metrics() const {
    std::map<std::pair<int64_t, int>, Line> out;
    std::ifstream in(dir_ / "run" / "metrics.jsonl");
    for (std::string text; std::getline(in, text);) {
      const auto j = nlohmann::json::parse(text);
      const std::pair<int64_t, int> key{j.at("step").get<int64_t>(), j.at("rank").get<int>()};
      EXPECT_EQ(out.count(key), 0u) << "step " << key.first << " rank " << key.second << " twice";
      out[key] =
          Line{j.at("pid").get<int64_t>(), j.at("replicas").get<int>(), j.value("degraded", false),
               j.at("state_crc32").get<int64_t>(), j.at("loss").get<double>()};
    }
    return out;
  }

  fs::path dir_;
};

// What every fault-injected run must show: the healthy replicas' processes took every step,
// the restarted one's lines come from new processes, steps after the failure ran degraded
// until it rejoined, and from the last step's state on every replica is the same (each rank's
// as its peer's at the same position in replica 0: replicas of `replica_size` ranks).
void expect_healed(const std::map<std::pair<int64_t, int>, Line>& lines, int ranks, int steps,
                   int failed_rank, int replica_size = 1) {
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

// hybrid_shard: 2 replicas of a 2-rank shard group. A replica's ranks hold different shards, so
// the replicas heal shard by shard and the shard groups are connected again with each
// membership.
const char* const kHybrid =
    " --set parallel.strategy=fsdp --set parallel.fsdp.sharding=hybrid_shard"
    " --set parallel.fsdp.replicate=2";

TEST_F(ReplicaTest, AKilledReplicaIsRestartedAloneAndHealsFromAHealthyOne) {
  // Rank 2 (a replica of its own) dies by SIGKILL after step 3; ranks 0 and 1 train on.
  const auto run = launch("SHARDTRAIN_KILL_AFTER_STEP=3", 3, 2);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("restarting replica 2 (ranks 2) alone (1 of 2)"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("taken in by the running replicas"), std::string::npos) << run.output;
  expect_healed(metrics(), 3, 400, 2);
}

TEST_F(ReplicaTest, AReplicaThatDiesAgainWhileItJoinsIsRestartedOnceMore) {
  const auto run = launch("SHARDTRAIN_KILL_AFTER_STEP=2 SHARDTRAIN_KILL_WHILE_JOINING=1", 3, 3);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("restarting replica 2 (ranks 2) alone (2 of 3)"), std::string::npos)
      << run.output;
  expect_healed(metrics(), 3, 400, 2);
}

TEST_F(ReplicaTest, AHybridShardReplicaLosingOneRankIsRestartedWholeAndHealsShardByShard) {
  // Rank 3, the last of replica 1, dies after step 3: its replica's rank 2 is stopped and both
  // start again, while replica 0 (ranks 0 and 1) trains on in its first processes.
  const auto run = launch("SHARDTRAIN_KILL_AFTER_STEP=3", 4, 2, kHybrid);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("restarting replica 1 (ranks 2,3) alone (1 of 2)"), std::string::npos)
      << run.output;
  expect_healed(metrics(), 4, 400, 3, 2);
}

TEST_F(ReplicaTest, AHybridShardReplicaThatDiesAgainWhileItJoinsIsRestartedOnceMore) {
  const auto run =
      launch("SHARDTRAIN_KILL_AFTER_STEP=2 SHARDTRAIN_KILL_WHILE_JOINING=1", 4, 3, kHybrid);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("restarting replica 1 (ranks 2,3) alone (2 of 3)"), std::string::npos)
      << run.output;
  expect_healed(metrics(), 4, 400, 3, 2);
}

TEST_F(ReplicaTest, ReplicasNeedALauncherThatRestartsThemAndAStrategyThatHasThem) {
  // Not under `launch --fault-tolerance`.
  const auto alone = testing::run_command(testing::cli() + " train --config " + config() +
                                          " --set run.dir=" + (dir_ / "alone").string());
  EXPECT_EQ(alone.exit_code, 2) << alone.output;
  EXPECT_NE(alone.output.find("shardtrain launch --fault-tolerance"), std::string::npos)
      << alone.output;
  // A strategy whose ranks hold shards of one copy has no replicas.
  const auto sharded = testing::run_command(testing::cli() + " train --config " + config() +
                                            " --set parallel.strategy=fsdp --set " +
                                            "run.dir=" + (dir_ / "sharded").string());
  EXPECT_EQ(sharded.exit_code, 2) << sharded.output;
  EXPECT_NE(sharded.output.find("needs data-parallel replicas"), std::string::npos)
      << sharded.output;
  // One rank is one replica: nothing to train on with.
  const auto one = testing::run_command(testing::cli() + " launch --fault-tolerance --nproc 1 -- " +
                                        testing::cli() + " train --config " + config() +
                                        " --set run.dir=" + (dir_ / "one").string());
  EXPECT_EQ(one.exit_code, 2) << one.output;
  EXPECT_NE(one.output.find("needs at least 2 replicas"), std::string::npos) << one.output;
  // The launcher runs replicas on one node.
  const auto nodes = testing::run_command(testing::cli() +
                                          " launch --fault-tolerance --nnodes 2 --master-port "
                                          "29999 --nproc 1 -- true");
  EXPECT_EQ(nodes.exit_code, 2) << nodes.output;
  EXPECT_NE(nodes.output.find("--fault-tolerance runs the replicas of one node"), std::string::npos)
      << nodes.output;
}

}  // namespace replica_test
}  // namespace shardtrain
