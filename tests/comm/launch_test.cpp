#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "comm/gloo_group.h"
#include "shardtrain/dist.h"
#include "support.h"

namespace shardtrain {
namespace launch_test {

using testing::cli;
using testing::CommandResult;
using testing::run_command;

TEST(LaunchTest, SetsTorchrunEnvironmentAndPrefixesLines) {
  const auto result =
      run_command(cli() +
                  " launch --nproc 2 -- sh -c 'echo env=$RANK/$WORLD_SIZE/$LOCAL_RANK/"
                  "$LOCAL_WORLD_SIZE/$MASTER_ADDR'");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("[rank 0] env=0/2/0/2/127.0.0.1"), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("[rank 1] env=1/2/1/2/127.0.0.1"), std::string::npos)
      << result.output;
}

TEST(LaunchTest, RanksShareTheCoresUnlessTheUserChoseThreads) {
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  const auto shared =
      run_command("env -u OMP_NUM_THREADS " + cli() +
                  " launch --nproc 2 --no-prefix -- sh -c 'echo threads=$OMP_NUM_THREADS'");
  ASSERT_EQ(shared.exit_code, 0) << shared.output;
  const auto at = shared.output.find("threads=");
  ASSERT_NE(at, std::string::npos) << shared.output;
  const long threads = std::atol(shared.output.c_str() + at + 8);
  EXPECT_GE(threads, 1) << shared.output;
  EXPECT_LE(threads, std::max(1L, cores / 2)) << shared.output;

  const auto chosen =
      run_command("OMP_NUM_THREADS=3 " + cli() +
                  " launch --nproc 2 --no-prefix -- sh -c 'echo threads=$OMP_NUM_THREADS'");
  EXPECT_EQ(chosen.exit_code, 0) << chosen.output;
  EXPECT_NE(chosen.output.find("threads=3\nthreads=3"), std::string::npos) << chosen.output;

  // One rank per node keeps LibTorch's own default.
  const auto alone = run_command("env -u OMP_NUM_THREADS " + cli() +
                                 " launch --nproc 1 -- sh -c 'echo threads=$OMP_NUM_THREADS.'");
  EXPECT_NE(alone.output.find("threads=."), std::string::npos) << alone.output;
}

// The launchers of nodes 0..n-1 on this machine (as separate nodes would run them), all with
// `flags`, node 0 in the foreground; the other nodes' output follows node 0's.
CommandResult nodes(int count, const std::string& flags, const std::string& program,
                    const std::string& nnodes = "") {
  const int port = testing::free_port();
  std::string script;
  for (int node = count - 1; node >= 0; --node) {
    const std::string launch =
        cli() + " launch --nnodes " + (nnodes.empty() ? std::to_string(count) : nnodes) +
        " --node-rank " + std::to_string(node) + " --master-port " + std::to_string(port) +
        (flags.find("--timeout") == std::string::npos ? " --timeout 60 " : " ") + flags +
        " -- sh -c '" + program + "'";
    script += node > 0 ? "(" + launch + " > node" + std::to_string(node) + ".log 2>&1) & "
                       : launch + "; status=$?; wait; ";
  }
  for (int node = 1; node < count; ++node) script += "cat node" + std::to_string(node) + ".log; ";
  const auto dir = testing::fresh_test_dir("shardtrain_launch_nodes");
  auto result = run_command("cd " + dir.string() + " && { " + script + "exit $status; }");
  std::filesystem::remove_all(dir);
  return result;
}

TEST(LaunchTest, MultiNodeRanksAreOffsetByTheNodeRankAndShareOnePort) {
  const auto result =
      nodes(3, "--nproc 2", "echo env=$RANK/$WORLD_SIZE/$LOCAL_RANK/$GROUP_RANK/port$MASTER_PORT");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("[rank 5] env=5/6/1/2/port"), std::string::npos) << result.output;
  // Node 0's launcher chose the port rank 0 hosts the ranks' store on; every node uses it.
  const auto at = result.output.find("port");
  ASSERT_NE(at, std::string::npos) << result.output;
  const std::string port = result.output.substr(at, result.output.find('\n', at) - at);
  size_t count = 0;
  for (size_t p = 0; (p = result.output.find(port, p)) != std::string::npos; ++p) ++count;
  EXPECT_EQ(count, 6u) << result.output;
}

TEST(LaunchTest, ATimeoutThatIsNotANumberOfSecondsIsRefused) {
  for (const char* timeout : {"nan", "1e-9", "-5"}) {
    const auto result = run_command(cli() + " launch --nproc 1 --timeout " + timeout + " -- env");
    EXPECT_NE(result.exit_code, 0) << timeout << ": " << result.output;
    EXPECT_NE(result.output.find("--timeout"), std::string::npos) << result.output;
    EXPECT_EQ(result.output.find("SHARDTRAIN_TIMEOUT"), std::string::npos) << result.output;
  }
}

// An interface this host does not have is named by the launcher, before any rank starts (and
// by a rank given it through GLOO_SOCKET_IFNAME, before Gloo's own check fails).
TEST(LaunchTest, AnInterfaceThisHostLacksIsNamed) {
  const auto result = run_command(cli() + " launch --nproc 1 --iface nosuchif0 -- env");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("network interface 'nosuchif0'"), std::string::npos)
      << result.output;
  EXPECT_EQ(result.output.find("GLOO_SOCKET_IFNAME=nosuchif0"), std::string::npos)
      << result.output;  // env never ran
  EXPECT_THROW(detail::make_gloo_device(ProcessGroupOptions().interface("nosuchif0")),
               std::invalid_argument);
  EXPECT_NO_THROW(detail::make_gloo_device(ProcessGroupOptions().interface("lo")));
}

TEST(LaunchTest, ANodeThatNeverJoinsIsNamed) {
  const auto start = std::chrono::steady_clock::now();
  const auto result =
      run_command(cli() + " launch --nproc 1 --nnodes 3 --node-rank 0 " + "--master-port " +
                  std::to_string(testing::free_port()) + " --timeout 2 -- true");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("node(s) 1,2 did not start a launcher within 2 s"),
            std::string::npos)
      << result.output;
  EXPECT_LT(seconds, 20);
}

// A rank of node 1 fails on the first attempt while node 0's ranks would run for a minute.
const char* kNodeOneFails =
    "if [ $GROUP_RANK = 1 ] && [ $LOCAL_RANK = 1 ] && [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then "
    "sleep 1; exit 3; fi; echo attempt=$TORCHELASTIC_RESTART_COUNT; "
    "if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then sleep 60; fi";

TEST(LaunchTest, AFailureOnOneNodeStopsEveryNodesRanks) {
  const auto start = std::chrono::steady_clock::now();
  const auto result = nodes(2, "--nproc 2 --kill-timeout 1", kNodeOneFails);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(result.exit_code, 3) << result.output;
  EXPECT_NE(result.output.find("shardtrain launch: node 1 ("), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("): rank 3 (pid"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("stopped this node's ranks"), std::string::npos) << result.output;
  EXPECT_LT(seconds, 30) << "node 0's ranks were not stopped";
}

TEST(LaunchTest, MaxRestartsRestartsEveryNodeTogether) {
  const auto result = nodes(2, "--nproc 2 --kill-timeout 1 --max-restarts 1", kNodeOneFails);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  for (int rank = 0; rank < 4; ++rank) {
    const std::string line = "[rank " + std::to_string(rank) + "] attempt=1";
    EXPECT_NE(result.output.find(line), std::string::npos) << line << "\n" << result.output;
  }
  // Both launchers say so: node 1 of its own rank, node 0 of node 1's.
  size_t restarts = 0;
  for (size_t p = 0; (p = result.output.find("restarting (1 of 1)", p)) != std::string::npos; ++p) {
    ++restarts;
  }
  EXPECT_EQ(restarts, 2u) << result.output;
}

// Node 1's launcher dies after its rank failed (rank 2 kills it when told to stop), so it never
// comes back for the restart: node 0 waits the timeout long, then ends naming it.
TEST(LaunchTest, ANodeThatDoesNotComeBackForTheRestartIsNamed) {
  const std::string program = std::string(
                                  "if [ $GROUP_RANK = 1 ] && [ $LOCAL_RANK = 0 ]; then "
                                  "trap \"kill -9 $PPID; exit 0\" TERM; sleep 60 & wait; fi; ") +
                              kNodeOneFails;
  const auto start = std::chrono::steady_clock::now();
  const auto result = nodes(2, "--nproc 2 --kill-timeout 5 --max-restarts 1 --timeout 8", program);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(result.exit_code, 3) << result.output;
  EXPECT_NE(result.output.find("not restarted: node(s) 1 did not stop its ranks and come back for "
                               "the restart within 8 s"),
            std::string::npos)
      << result.output;
  EXPECT_LT(seconds, 40) << result.output;
}

// --nnodes 1:2: node 1's launcher dies with its ranks and does not come back; after the timeout
// node 0 goes on alone, its ranks numbered over the one node that remains.
TEST(LaunchTest, AnElasticJobGoesOnWithoutANodeThatDoesNotComeBack) {
  const std::string program =
      "if [ $GROUP_RANK = 1 ] && [ $LOCAL_RANK = 0 ]; then "
      "trap \"kill -9 $PPID; exit 0\" TERM; sleep 60 & wait; fi; "
      "if [ $GROUP_RANK = 1 ] && [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then sleep 1; exit 3; fi; "
      "echo attempt=$TORCHELASTIC_RESTART_COUNT world=$WORLD_SIZE; "
      "if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then sleep 60; fi";
  const auto result =
      nodes(2, "--nproc 2 --kill-timeout 5 --max-restarts 1 --timeout 4", program, "1:2");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("restarting on 1 node (0) of --nnodes 1:2 (1 of 1)"),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("[rank 0] attempt=1 world=2"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("[rank 1] attempt=1 world=2"), std::string::npos) << result.output;

  // Without MIN:MAX the same loss ends the job naming the node.
  const auto rigid = nodes(2, "--nproc 2 --kill-timeout 5 --max-restarts 1 --timeout 4", program);
  EXPECT_EQ(rigid.exit_code, 3) << rigid.output;
  EXPECT_NE(rigid.output.find("node(s) 1 did not stop its ranks and come back"), std::string::npos)
      << rigid.output;
}

// A node lost from an elastic job and started again waits, and the next restart takes it in.
TEST(LaunchTest, ANodeOfAnElasticJobStartedAgainJoinsAtTheNextRestart) {
  const std::string port = std::to_string(testing::free_port());
  const auto dir = testing::fresh_test_dir("shardtrain_launch_rejoin");
  // Attempt 0: node 1 fails and its launcher dies. Attempt 1 (node 0 alone): rank 0 fails once
  // the returning node 1 waits ("go"). Attempt 2: both nodes.
  const std::string program =
      "if [ $TORCHELASTIC_RESTART_COUNT = 0 ] && [ $GROUP_RANK = 1 ]; then "
      "if [ $LOCAL_RANK = 0 ]; then trap \"kill -9 $PPID; exit 0\" TERM; sleep 60 & wait; fi; "
      "sleep 1; exit 3; fi; "
      "if [ $TORCHELASTIC_RESTART_COUNT = 1 ] && [ $RANK = 0 ]; then "
      "while [ ! -f go ]; do sleep 0.2; done; exit 5; fi; "
      "echo attempt=$TORCHELASTIC_RESTART_COUNT world=$WORLD_SIZE; "
      "if [ $TORCHELASTIC_RESTART_COUNT != 2 ]; then sleep 60; fi";
  const auto launch = [&](int node) {
    return cli() + " launch --nnodes 1:2 --node-rank " + std::to_string(node) + " --master-port " +
           port + " --nproc 2 --kill-timeout 5 --max-restarts 2 --timeout 4 -- sh -c '" + program +
           "'";
  };
  const auto wait_for = [](const std::string& file, const std::string& text) {
    return "for i in $(seq 600); do grep -q '" + text + "' " + file +
           " 2>/dev/null && break; sleep 0.1; done; ";
  };
  const auto result =
      run_command("cd " + dir.string() + " && { (" + launch(1) + " > node1.log 2>&1) & (" +
                  launch(0) + " > node0.log 2>&1; echo $? > node0.status) & " +
                  wait_for("node0.log", "restarting on 1 node") + "(" + launch(1) +
                  " > node1b.log 2>&1) & " + wait_for("node1b.log", "taken in at the job") +
                  "touch go; wait; cat node0.log node1b.log; exit $(cat node0.status); }");
  std::filesystem::remove_all(dir);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("restarting on 2 nodes (0,1) of --nnodes 1:2 (2 of 2)"),
            std::string::npos)
      << result.output;
  for (int rank = 0; rank < 4; ++rank) {
    const std::string line = "[rank " + std::to_string(rank) + "] attempt=2 world=4";
    EXPECT_NE(result.output.find(line), std::string::npos) << line << "\n" << result.output;
  }
}

TEST(LaunchTest, AnElasticRangeThatIsNoRangeIsRefused) {
  for (const char* nnodes : {"3:2", "0:2", "a:2", "2:", "1:2:3"}) {
    const auto result =
        run_command(cli() + " launch --nproc 1 --nnodes " + nnodes + " --master-port 1 -- true");
    EXPECT_EQ(result.exit_code, 2) << nnodes << ": " << result.output;
    EXPECT_NE(result.output.find(std::string("--nnodes ") + nnodes), std::string::npos)
        << result.output;
  }
  const auto above = run_command(cli() + " launch --nproc 1 --nnodes 3:2 -- true");
  EXPECT_NE(above.output.find("MIN (3) is above MAX (2)"), std::string::npos) << above.output;
}

// Every node's launcher must run the same --nproc, --nnodes and --max-restarts, or nodes would
// decide differently whether to restart.
TEST(LaunchTest, NodesWithOtherLauncherSettingsAreRefused) {
  const std::string port = std::to_string(testing::free_port());
  const auto dir = testing::fresh_test_dir("shardtrain_launch_settings");
  const auto result = run_command(
      "cd " + dir.string() + " && { (" + cli() + " launch --nproc 1 --nnodes 2 --node-rank 1 " +
      "--master-port " + port + " --timeout 30 -- true > node1.log 2>&1) & " + cli() +
      " launch --nproc 1 --nnodes 2 --node-rank 0 --master-port " + port +
      " --timeout 30 --max-restarts 1 -- true; status=$?; wait; cat node1.log; exit $status; }");
  std::filesystem::remove_all(dir);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("node 1's launcher runs --nproc 1 --nnodes 2 --max-restarts 0 but "
                               "node 0's runs --nproc 1 --nnodes 2 --max-restarts 1"),
            std::string::npos)
      << result.output;
}

TEST(LaunchTest, FailedRankStopsTheOthersAndIsNamed) {
  const auto start = std::chrono::steady_clock::now();
  const auto result = run_command(cli() +
                                  " launch --nproc 3 --kill-timeout 2 -- "
                                  "sh -c 'if [ \"$RANK\" = 1 ]; then exit 3; fi; sleep 60'");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(result.exit_code, 3) << result.output;
  EXPECT_NE(result.output.find("rank 1"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("exited with status 3"), std::string::npos) << result.output;
  EXPECT_LT(seconds, 30) << "the sleeping ranks were not stopped";
}

TEST(LaunchTest, RankIgnoringSigtermIsKilledAfterTheTimeout) {
  const auto start = std::chrono::steady_clock::now();
  const auto result =
      run_command(cli() +
                  " launch --nproc 2 --kill-timeout 1 -- "
                  "sh -c 'if [ \"$RANK\" = 0 ]; then sleep 0.5; exit 7; fi; trap \"\" TERM; "
                  "sleep 60'");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(result.exit_code, 7) << result.output;
  EXPECT_NE(result.output.find("rank 0"), std::string::npos) << result.output;
  EXPECT_LT(seconds, 30);
}

TEST(LaunchTest, RestartsAfterAFailure) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("shardtrain_restart_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  // Rank 0 fails on the first run only; rank 1 waits until it is stopped.
  const auto result = run_command(
      cli() + " launch --nproc 2 --max-restarts 1 --kill-timeout 2 -- sh -c 'f=" + dir.string() +
      "/failed_once; if [ ! -f $f ]; then if [ $RANK = 0 ]; then touch $f; exit 4; fi; "
      "sleep 60; fi; echo second-run'");
  std::filesystem::remove_all(dir);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("restarting (1 of 1)"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("second-run"), std::string::npos) << result.output;
}

TEST(LaunchTest, BadInvocationsAreNamed) {
  auto result = run_command(cli() + " launch --nproc 2");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("no program to launch"), std::string::npos) << result.output;
  result = run_command(cli() + " launch --nproc 2 --nnodes 2 -- true");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("--master-port is required"), std::string::npos) << result.output;
  result = run_command(cli() + " launch -- true");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("--nproc is required (or --hostfile)"), std::string::npos)
      << result.output;
  result = run_command(cli() + " launch --nproc 1 --include node1 -- true");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("--include and --exclude select hosts of a --hostfile"),
            std::string::npos)
      << result.output;
  result = run_command(cli() + " launch --hostfile /dev/null --nnodes 2 -- true");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("--hostfile sets --nnodes and --node-rank itself"),
            std::string::npos)
      << result.output;
  result = run_command(cli() + " launch --nproc 1 -- /nonexistent/program");
  EXPECT_EQ(result.exit_code, 127) << result.output;
  EXPECT_NE(result.output.find("cannot run '/nonexistent/program'"), std::string::npos)
      << result.output;
}

TEST(LaunchTest, CollectivesBenchmarkEndToEnd) {
  const auto result =
      run_command(cli() + " launch --nproc 2 -- " + cli() +
                  " bench collectives --op all --min-bytes 1K --max-bytes 8K --iters 2 "
                  "--warmup 1");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  for (const char* op : {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"}) {
    EXPECT_NE(result.output.find(op), std::string::npos) << result.output;
  }
  EXPECT_EQ(result.output.find("WRONG"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("busbw"), std::string::npos) << result.output;
}

TEST(CliTest, HelpDescribesEveryFlag) {
  const auto top = run_command(cli() + " --help");
  EXPECT_EQ(top.exit_code, 0);
  EXPECT_NE(top.output.find("launch"), std::string::npos) << top.output;
  EXPECT_NE(top.output.find("bench"), std::string::npos) << top.output;
  const auto launch = run_command(cli() + " launch --help");
  for (const char* flag : {"--nproc", "--nnodes", "--node-rank", "--master-addr", "--master-port",
                           "--max-restarts", "--kill-timeout", "--no-prefix"}) {
    EXPECT_NE(launch.output.find(flag), std::string::npos) << flag << "\n" << launch.output;
  }
  const auto train = run_command(cli() + " train --help");
  for (const char* flag : {"--config", "--set"}) {
    EXPECT_NE(train.output.find(flag), std::string::npos) << flag << "\n" << train.output;
  }
  const auto prepare = run_command(cli() + " data prepare --help");
  for (const char* flag : {"--corpus", "--out", "--tokenizer", "--gpt2-dir"}) {
    EXPECT_NE(prepare.output.find(flag), std::string::npos) << flag << "\n" << prepare.output;
  }
  const auto bench = run_command(cli() + " bench collectives --help");
  for (const char* flag : {"--op", "--min-bytes", "--max-bytes", "--step-factor", "--iters",
                           "--warmup", "--dtype", "--timeout", "--no-check"}) {
    EXPECT_NE(bench.output.find(flag), std::string::npos) << flag << "\n" << bench.output;
  }
}

TEST(CliTest, CollectivesLargerThanTheHostAreRefusedBeforeAllocating) {
  const auto result = run_command(cli() + " bench collectives --min-bytes 64G --max-bytes 64G");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("more than the"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("can't allocate"), std::string::npos) << result.output;
}

// A rank whose rank 0 never comes gives shardtrain's one message, not LibTorch's log lines
// (c10d's connection retries, glog's warning about logging before it is set up), unless
// TORCH_CPP_LOG_LEVEL asks for them.
TEST(CliTest, ARankAloneSaysSoWithoutLibTorchsLogLines) {
  const auto dir = testing::fresh_test_dir("shardtrain_alone");
  const std::string env =
      "RANK=1 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 "
      "MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
      std::to_string(testing::free_port()) + " ";
  const std::string train =
      cli() + " train --config " + std::string(SHARDTRAIN_SOURCE_DIR) +
      "/configs/zero_tiny.toml --set run.timeout=3 --set run.dir=" + (dir / "run").string();
  const auto alone = run_command(env + train);
  EXPECT_NE(alone.exit_code, 0) << alone.output;
  EXPECT_NE(alone.output.find("timed out"), std::string::npos) << alone.output;
  EXPECT_EQ(alone.output.find("InitGoogleLogging"), std::string::npos) << alone.output;
  EXPECT_EQ(alone.output.find("socket.cpp"), std::string::npos) << alone.output;
  const auto verbose = run_command("TORCH_CPP_LOG_LEVEL=INFO " + env + train);
  EXPECT_NE(verbose.exit_code, 0) << verbose.output;
  EXPECT_NE(verbose.output.find("c10d"), std::string::npos) << verbose.output;
  std::filesystem::remove_all(dir);
}

TEST(CliTest, UnknownOptionIsAnError) {
  const auto result = run_command(cli() + " bench collectives --op gather_scatter");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("gather_scatter"), std::string::npos) << result.output;
}

}  // namespace launch_test
}  // namespace shardtrain
