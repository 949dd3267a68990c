#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "support.h"

namespace shardtrain {
namespace {

using testing::cli;
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

TEST(LaunchTest, MultiNodeRanksAreOffsetByTheNodeRank) {
  const auto result =
      run_command(cli() +
                  " launch --nproc 2 --nnodes 3 --node-rank 2 --master-port 29999 -- "
                  "sh -c 'echo env=$RANK/$WORLD_SIZE/$LOCAL_RANK/$MASTER_PORT'");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("[rank 5] env=5/6/1/29999"), std::string::npos) << result.output;
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
  for (const char* op : {"all_reduce", "all_gather", "reduce_scatter", "broadcast"}) {
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

TEST(CliTest, UnknownOptionIsAnError) {
  const auto result = run_command(cli() + " bench collectives --op all_to_all");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("all_to_all"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace shardtrain
