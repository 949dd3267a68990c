// Replica fault tolerance, by fault injection as torchft's tests do: `shardtrain launch
// --fault-tolerance` runs DDP replicas; a replica killed mid-run is restarted alone while the
// others train on without stopping, rejoins at a step boundary and takes a healthy replica's
// state, after which every replica's state is the same bit for bit.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "replica_support.h"
#include "shardtrain/train.h"
#include "support.h"

namespace shardtrain {
namespace replica_test {

namespace fs = std::filesystem;

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

  std::map<std::pair<int64_t, int>, testing::ReplicaLine> metrics() const {
    return testing::replica_metrics(dir_ / "run" / "metrics.jsonl");
  }

  fs::path dir_;
};

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
  testing::expect_healed(metrics(), 3, 400, 2);
}

TEST_F(ReplicaTest, AReplicaThatDiesAgainWhileItJoinsIsRestartedOnceMore) {
  const auto run = launch("SHARDTRAIN_KILL_AFTER_STEP=2 SHARDTRAIN_KILL_WHILE_JOINING=1", 3, 3);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("restarting replica 2 (ranks 2) alone (2 of 3)"), std::string::npos)
      << run.output;
  testing::expect_healed(metrics(), 3, 400, 2);
}

TEST_F(ReplicaTest, AReplicaLostInASaveCostsThatCheckpointOnly) {
  // Rank 2 dies as the save after step 50 starts: ranks 0 and 1 give that checkpoint up
  // (`latest` stays as it was), train on, and the final one is written by every replica.
  const auto run = launch("SHARDTRAIN_KILL_IN_SAVE=50", 3, 2,
                          " --set train.checkpoint_every=50 --set train.keep_checkpoints=100");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("the checkpoint of step 50 is not written: a replica failed during "
                            "the save"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("restarting replica 2 (ranks 2) alone (1 of 2)"), std::string::npos)
      << run.output;
  testing::expect_healed(metrics(), 3, 400, 2);
  const fs::path checkpoints = dir_ / "run" / "checkpoints";
  EXPECT_FALSE(fs::exists(checkpoints / "step_000050"));
  EXPECT_TRUE(fs::exists(checkpoints / "step_000400"));
}

TEST_F(ReplicaTest, AHybridShardReplicaLosingOneRankIsRestartedWholeAndHealsShardByShard) {
  // Rank 3, the last of replica 1, dies after step 3: its replica's rank 2 is stopped and both
  // start again, while replica 0 (ranks 0 and 1) trains on in its first processes.
  const auto run = launch("SHARDTRAIN_KILL_AFTER_STEP=3", 4, 2, kHybrid);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("restarting replica 1 (ranks 2,3) alone (1 of 2)"), std::string::npos)
      << run.output;
  testing::expect_healed(metrics(), 4, 400, 3, 2);
}

TEST_F(ReplicaTest, AHybridShardReplicaLosingARankInAnEvaluationHealsAsAfterAStep) {
  // Rank 3 dies as the evaluation after step 50 starts, whose forward passes gather over the
  // shard groups: its peer rank 2 fails in that evaluation's gathers, while replica 0 evaluates
  // within its own shard group and trains on.
  const auto run = launch("SHARDTRAIN_KILL_IN_EVALUATION=50", 4, 2,
                          std::string(kHybrid) +
                              " --set train.eval_every=50 --set "
                              "data.eval_sequences=8");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("restarting replica 1 (ranks 2,3) alone (1 of 2)"), std::string::npos)
      << run.output;
  testing::expect_healed(metrics(), 4, 400, 3, 2);
}

TEST_F(ReplicaTest, AHybridShardReplicaThatDiesAgainWhileItJoinsIsRestartedOnceMore) {
  const auto run =
      launch("SHARDTRAIN_KILL_AFTER_STEP=2 SHARDTRAIN_KILL_WHILE_JOINING=1", 4, 3, kHybrid);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("restarting replica 1 (ranks 2,3) alone (2 of 3)"), std::string::npos)
      << run.output;
  testing::expect_healed(metrics(), 4, 400, 3, 2);
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
  // Replicas heal within a job of fixed nodes; an elastic one restarts from a checkpoint.
  const auto elastic = testing::run_command(testing::cli() +
                                            " launch --fault-tolerance --nnodes 1:2 --master-port "
                                            "29999 --nproc 1 -- true");
  EXPECT_EQ(elastic.exit_code, 2) << elastic.output;
  EXPECT_NE(elastic.output.find("--fault-tolerance with --nnodes 1:2"), std::string::npos)
      << elastic.output;
}

}  // namespace replica_test
}  // namespace shardtrain
