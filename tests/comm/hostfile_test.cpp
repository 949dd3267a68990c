// `shardtrain launch --hostfile`: DeepSpeed's hostfile format, --include / --exclude, and the
// fan-out through an ssh command (here one that runs the remote command on this machine, so
// that two "hosts" are localhost and 127.0.0.1; tests/comm/multihost_test.cpp uses real sshd).
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "shardtrain/launch.h"
#include "support.h"

namespace shardtrain {
namespace hostfile_test {

namespace fs = std::filesystem;

class HostfileTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::fresh_test_dir("shardtrain_hostfile"); }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) const {
    const fs::path path = dir_ / name;
    std::ofstream(path) << text;
    return path.string();
  }
  std::string error_of(const std::string& text, const std::string& include = "",
                       const std::string& exclude = "") const {
    try {
      select_hosts(read_hostfile(write("hosts", text)), include, exclude);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  }
  // An "ssh" that drops the host and runs the remote command here.
  std::string local_ssh() const {
    const std::string path = write("fake_ssh", "#!/bin/sh\nshift\nexec /bin/sh -c \"$*\"\n");
    fs::permissions(path, fs::perms::owner_all);
    return path;
  }
  fs::path dir_;
};

TEST_F(HostfileTest, ReadsDeepSpeedsFormat) {
  const auto hosts = read_hostfile(
      write("hosts", "# the cluster\nworker-0 slots=4\n\n  worker-1 slots=2   # small one\n"));
  ASSERT_EQ(hosts.size(), 2u);
  EXPECT_EQ(hosts[0].host, "worker-0");
  EXPECT_EQ(hosts[0].slots, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(hosts[1].host, "worker-1");
  EXPECT_EQ(hosts[1].slots, (std::vector<int>{0, 1}));
}

TEST_F(HostfileTest, IncludeAndExcludeSelectHostsAndSlotsAsDeepSpeedDoes) {
  const auto all = read_hostfile(write("hosts", "a slots=4\nb slots=4\nc slots=4\n"));
  auto kept = select_hosts(all, "a@c:0,2", "");
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept[0].host, "a");
  EXPECT_EQ(kept[0].slots.size(), 4u);
  EXPECT_EQ(kept[1].host, "c");
  EXPECT_EQ(kept[1].slots, (std::vector<int>{0, 2}));
  kept = select_hosts(all, "", "b@c:1");
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept[0].host, "a");
  EXPECT_EQ(kept[1].slots, (std::vector<int>{0, 2, 3}));
}

TEST_F(HostfileTest, BadHostfilesAndSelectionsAreRefusedNamingTheProblem) {
  EXPECT_NE(error_of("a slots=2\nb slot=2\n").find("line 2: expected 'HOST slots=N'"),
            std::string::npos);
  EXPECT_NE(error_of("a slots=0\n").find("line 1: expected 'HOST slots=N' with N >= 1"),
            std::string::npos);
  EXPECT_NE(error_of("a slots=2\na slots=2\n").find("host 'a' is listed twice (first on line 1)"),
            std::string::npos);
  EXPECT_NE(error_of("# nothing\n").find("lists no host"), std::string::npos);
  EXPECT_NE(error_of("a slots=2\n", "z").find("--include names host 'z', which the hostfile lacks"),
            std::string::npos);
  EXPECT_NE(error_of("a slots=2\n", "a:2").find("slot 2 of host 'a', which has 2 slot(s)"),
            std::string::npos);
  EXPECT_NE(error_of("a slots=2\n", "a:x").find("slot 'x' of host 'a' is not a slot index"),
            std::string::npos);
  EXPECT_NE(error_of("a slots=2\n", "a", "a").find("cannot be given together"), std::string::npos);
  EXPECT_NE(error_of("a slots=2\n", "", "a").find("--exclude leaves no slot to run on"),
            std::string::npos);
  const auto unequal = testing::run_command(testing::cli() + " launch --hostfile " +
                                            write("hosts", "a slots=2\nb slots=1\n") + " -- true");
  EXPECT_EQ(unequal.exit_code, 2) << unequal.output;
  EXPECT_NE(unequal.output.find("host 'a' has 2 slot(s) but host 'b' has 1"), std::string::npos)
      << unequal.output;
}

TEST_F(HostfileTest, StartsALauncherPerHostWithHostPrefixedLines) {
  const std::string hosts = write("hosts", "localhost slots=2\n127.0.0.1 slots=2\n");
  const auto result = testing::run_command(
      "cd " + dir_.string() + " && SHARDTRAIN_PROBE=forwarded " + testing::cli() +
      " launch --hostfile " + hosts + " --master-port " + std::to_string(testing::free_port()) +
      " --ssh " + local_ssh() +
      " -- sh -c 'echo env=$RANK/$WORLD_SIZE/$LOCAL_RANK/$MASTER_ADDR/$SHARDTRAIN_PROBE/$(pwd)'");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  const std::string tail = "/localhost/forwarded/" + dir_.string();
  EXPECT_NE(result.output.find("[localhost:rank 0] env=0/4/0" + tail), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("[127.0.0.1:rank 3] env=3/4/1" + tail), std::string::npos)
      << result.output;
  // --include keeps one slot of each host.
  const auto one_each = testing::run_command(
      testing::cli() + " launch --hostfile " + hosts + " --include localhost:1@127.0.0.1:0" +
      " --master-port " + std::to_string(testing::free_port()) + " --ssh " + local_ssh() +
      " -- sh -c 'echo env=$RANK/$WORLD_SIZE'");
  EXPECT_EQ(one_each.exit_code, 0) << one_each.output;
  EXPECT_NE(one_each.output.find("[127.0.0.1:rank 1] env=1/2"), std::string::npos)
      << one_each.output;
}

TEST_F(HostfileTest, AFailedHostStopsEveryHost) {
  const std::string hosts = write("hosts", "localhost slots=1\n127.0.0.1 slots=1\n");
  const auto start = std::chrono::steady_clock::now();
  const auto result = testing::run_command(
      testing::cli() + " launch --hostfile " + hosts + " --kill-timeout 1 --master-port " +
      std::to_string(testing::free_port()) + " --ssh " + local_ssh() +
      " -- sh -c 'if [ $RANK = 1 ]; then exit 5; fi; sleep 60'");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(result.exit_code, 5) << result.output;
  // Node 0's launcher stops on node 1's report and may end first: either names rank 1's failure.
  EXPECT_NE(result.output.find("rank 1 (pid"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("exited with status 5; stopped the ranks of every host"),
            std::string::npos)
      << result.output;
  EXPECT_LT(seconds, 30) << result.output;
}

TEST_F(HostfileTest, SigintStopsTheRanksOfEveryHost) {
  const std::string hosts = write("hosts", "localhost slots=1\n127.0.0.1 slots=1\n");
  const std::string log = (dir_ / "log").string();
  const auto started = testing::run_command(
      testing::cli() + " launch --hostfile " + hosts + " --kill-timeout 1 --master-port " +
      std::to_string(testing::free_port()) + " --ssh " + local_ssh() + " -- sh -c 'echo $$ > " +
      dir_.string() + "/up.$RANK; exec sleep 600' > " + log + " 2>&1 & echo $!");
  const int launcher = std::atoi(started.output.c_str());
  ASSERT_GT(launcher, 0);
  auto both_up = [&] { return fs::exists(dir_ / "up.0") && fs::exists(dir_ / "up.1"); };
  for (int i = 0; i < 600 && !both_up(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(both_up());
  kill(launcher, SIGINT);
  bool gone = false;
  for (int i = 0; i < 600 && !gone; ++i) {
    gone = !testing::alive(launcher);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(gone);
  // Neither rank is left on either "host" (each wrote its pid, then became `sleep 600`).
  std::ifstream in(log);
  const std::string output((std::istreambuf_iterator<char>(in)), {});
  for (const char* rank : {"up.0", "up.1"}) {
    int pid = 0;
    std::ifstream(dir_ / rank) >> pid;
    ASSERT_GT(pid, 0);
    EXPECT_FALSE(testing::alive(pid)) << rank << "\n" << output;
  }
  EXPECT_NE(output.find("interrupted by signal 2; stopped the ranks of every host"),
            std::string::npos)
      << output;
}

}  // namespace hostfile_test
}  // namespace shardtrain
