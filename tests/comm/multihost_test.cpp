// Two hosts on one machine: network namespaces joined by a veth pair (10.99.0.1 and 10.99.0.2),
// where the hostname resolves to loopback as in most containers and GLOO_SOCKET_IFNAME is unset.
// Training across them matches one process; `launch --hostfile` starts both over ssh (an sshd
// the test starts in each namespace, with a throw-away key) and SIGINT stops both; a host whose
// ranks are killed restarts on both hosts from the latest checkpoint; a link taken down ends
// both sides within the timeout, naming the other host. Skipped, saying why, where namespaces
// cannot be made (not root, or no CAP_SYS_ADMIN / CAP_NET_ADMIN).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <utility>

#include "replica_support.h"
#include "shardtrain/sharded_checkpoint.h"
#include "support.h"

namespace shardtrain {
namespace multihost_test {

namespace fs = std::filesystem;
using Clock = std::chrono::system_clock;

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::map<std::string, at::Tensor> tensors_of(const fs::path& dir) {
  const ShardedCheckpointReader reader(dir.string());
  std::map<std::string, at::Tensor> out;
  for (const auto& spec : reader.tensors()) out[spec.name] = reader.read(spec.name);
  return out;
}

// Waits up to `seconds` for `done`; false if it never held.
template <typename F>
bool wait_until(double seconds, F&& done) {
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1e3));
  while (!done()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

class TwoHostsTest : public ::testing::Test {
 protected:
  static constexpr const char* kAddress[2] = {"10.99.0.1", "10.99.0.2"};

  void SetUp() override {
    const std::string id = std::to_string(getpid());
    ns_[0] = "st" + id + "a";
    ns_[1] = "st" + id + "b";
    const auto made = testing::run_command(
        "ip netns add " + ns_[0] + " && ip netns add " + ns_[1] + " && ip link add v" + id +
        "a netns " + ns_[0] + " type veth peer name v" + id + "b netns " + ns_[1] + " && ip -n " +
        ns_[0] + " addr add 10.99.0.1/24 dev v" + id + "a && ip -n " + ns_[1] +
        " addr add 10.99.0.2/24 dev v" + id + "b && ip -n " + ns_[0] + " link set v" + id +
        "a up && ip -n " + ns_[1] + " link set v" + id + "b up && ip -n " + ns_[0] +
        " link set lo up && ip -n " + ns_[1] + " link set lo up");
    link_ = "v" + id + "b";
    if (made.exit_code != 0) {
      GTEST_SKIP() << "two hosts cannot be made from network namespaces here (needs root with "
                      "CAP_SYS_ADMIN and CAP_NET_ADMIN, and iproute2): "
                   << made.output;
    }
    // Inside each namespace the hostname resolves to loopback, as in many containers and VMs
    // (`ip netns exec` puts /etc/netns/NAME/hosts over /etc/hosts).
    char name[256] = {};
    gethostname(name, sizeof(name) - 1);
    for (const auto& ns : ns_) {
      fs::create_directories("/etc/netns/" + ns);
      std::ofstream("/etc/netns/" + ns + "/hosts")
          << "127.0.0.1 localhost\n127.0.1.1 " << name << "\n";
    }
    dir_ = testing::fresh_test_dir("shardtrain_multihost");
    std::ofstream corpus(dir_ / "corpus.txt");
    for (int i = 0; i < 300; ++i) {
      corpus << "the five boxing wizards jump quickly " << i % 9 << ", row " << i % 23 << ".\n";
    }
    config_ = (dir_ / "run.toml").string();
    std::ofstream(config_) << "[model]\npreset = \"tiny\"\nvocab_size = 260\n[data]\ncorpus = \""
                           << (dir_ / "corpus.txt").string() << "\"\nseq_len = 32\n[train]\n"
                           << "steps = 3\nsample_tokens = 0\n[run]\nthreads = 1\n";
  }

  void TearDown() override {
    for (const auto& ns : ns_) {
      if (ns.empty()) continue;
      testing::run_command("ip netns pids " + ns + " | xargs -r kill -9; ip netns del " + ns);
      fs::remove_all("/etc/netns/" + ns);
    }
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  // `command` run on host 0 or 1, with no interface chosen for it.
  std::string on(int host, const std::string& command) const {
    return "ip netns exec " + ns_[host] + " env -u GLOO_SOCKET_IFNAME -u NCCL_SOCKET_IFNAME " +
           command;
  }

  std::string train(const std::string& settings) const {
    return testing::cli() + " train --config " + config_ + " " + settings;
  }

  // Starts host `host`'s launcher of a two-host job in the background; its output goes to
  // node<host>.log, its exit status and end time to node<host>.end.
  void start_node(int host, const std::string& flags, const std::string& train_settings,
                  const std::string& nnodes = "2", const std::string& env = "") const {
    const std::string name = (dir_ / ("node" + std::to_string(host))).string();
    const std::string launch = testing::cli() + " launch --nproc 2 --nnodes " + nnodes +
                               " --node-rank " + std::to_string(host) + " --master-addr " +
                               kAddress[0] + " --master-port 29500 " + flags + " -- " +
                               train(train_settings);
    testing::run_command("(" + on(host, env + " " + launch) + " > " + name +
                         ".log 2>&1; echo $? $(date +%s.%N) > " + name + ".end.tmp; mv " + name +
                         ".end.tmp " + name + ".end) > /dev/null 2>&1 &");
  }

  struct Ended {
    int exit_code = -1;
    double at = 0;  // seconds since the epoch
    std::string output;
  };
  Ended wait_node(int host, double seconds = 300) const {
    const fs::path end = dir_ / ("node" + std::to_string(host) + ".end");
    Ended ended;
    if (!wait_until(seconds, [&] { return fs::exists(end); })) return ended;
    std::istringstream(read_file(end)) >> ended.exit_code >> ended.at;
    ended.output = read_file(dir_ / ("node" + std::to_string(host) + ".log"));
    fs::remove(end);
    return ended;
  }

  // Both hosts' output, host 0's first.
  static std::string both_outputs(const Ended& zero, const Ended& one) {
    return "--- host 0:\n" + zero.output + "--- host 1:\n" + one.output;
  }

  // Runs a two-host job of two nodes to its end (each launcher given `env`, waited for up to
  // `seconds`): host 0's end, then host 1's.
  std::pair<Ended, Ended> run_both(const std::string& flags, const std::string& settings,
                                   const std::string& env = "", double seconds = 300) const {
    start_node(1, flags, settings, "2", env);
    start_node(0, flags, settings, "2", env);
    const Ended zero = wait_node(0, seconds);
    return {zero, wait_node(1, seconds)};
  }

  // Runs a two-host job to its end; both hosts' output together.
  testing::CommandResult two_hosts(const std::string& flags, const std::string& settings) const {
    const auto [zero, one] = run_both(flags, settings);
    return {zero.exit_code != 0 ? zero.exit_code : one.exit_code, both_outputs(zero, one)};
  }

  // Processes of `shardtrain train` running on `host`.
  std::vector<int> trainers_on(int host) const {
    std::vector<int> pids;
    std::istringstream list(testing::run_command("ip netns pids " + ns_[host]).output);
    for (int pid; list >> pid;) {
      std::string cmdline = read_file("/proc/" + std::to_string(pid) + "/cmdline");
      for (char& c : cmdline) c = c == '\0' ? ' ' : c;
      if (cmdline.find(" train --config ") != std::string::npos &&
          cmdline.find(" launch ") == std::string::npos) {
        pids.push_back(pid);
      }
    }
    return pids;
  }

  std::string ns_[2];
  std::string link_;
  fs::path dir_;
  std::string config_;
};

TEST_F(TwoHostsTest, TrainingAcrossTwoHostsMatchesOneProcess) {
  const auto one = testing::run_command(
      testing::cli() + " launch --nproc 1 -- " +
      train("--set train.micro_batch=8 --set run.dir=" + (dir_ / "one").string()));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const auto want_losses = testing::rank0_losses(dir_ / "one" / "metrics.jsonl");
  ASSERT_EQ(want_losses.size(), 3u);
  const auto want = tensors_of(dir_ / "one" / "checkpoints" / "step_000003");
  for (const auto& [name, settings] : std::map<std::string, std::string>{
           {"ddp", "--set parallel.strategy=ddp"},
           {"hybrid_shard",
            "--set parallel.strategy=fsdp --set parallel.fsdp.sharding=hybrid_shard"},
           {"zero3", "--set parallel.strategy=zero --set parallel.zero.stage=3"}}) {
    SCOPED_TRACE(name);
    const fs::path run = dir_ / name;
    const auto result =
        two_hosts("", settings + " --set train.micro_batch=2 --set run.dir=" + run.string());
    ASSERT_EQ(result.exit_code, 0) << result.output;
    // Each host says which address it chose, since its hostname is loopback.
    for (const char* address : kAddress) {
      EXPECT_NE(result.output.find(std::string("ranks use ") + address +
                                   ", its address on the route to MASTER_ADDR 10.99.0.1"),
                std::string::npos)
          << result.output;
    }
    if (name == "hybrid_shard") {
      // One replica per host: shards inside a host, gradients averaged across the two.
      EXPECT_NE(result.output.find("(2 replicas of 2-rank shard groups)"), std::string::npos)
          << result.output;
    }
    testing::expect_same_losses(testing::rank0_losses(run / "metrics.jsonl"), want_losses, 1e-5);
    const auto got = tensors_of(run / "checkpoints" / "step_000003");
    for (const auto& [tensor_name, tensor] : want) {
      if (tensor_name.rfind("optim.", 0) == 0) continue;
      ASSERT_TRUE(got.count(tensor_name)) << tensor_name;
      // 1e-5 relative; and 1e-6 absolute for values near zero, which AdamW's first steps move
      // by about lr whatever the size of their (near-zero) gradient.
      EXPECT_TRUE(at::allclose(got.at(tensor_name), tensor, 1e-5, 1e-6)) << tensor_name;
    }
  }
}

TEST_F(TwoHostsTest, HostfileLaunchRunsOverSshAndSigintStopsEveryHost) {
  if (!fs::exists("/usr/sbin/sshd")) {
    GTEST_SKIP() << "/usr/sbin/sshd is not installed (Debian's openssh-server; "
                    "scripts/setup.sh --test installs it)";
  }
  const std::string keys = (dir_ / "keys").string();
  const auto made =
      testing::run_command("mkdir -p /run/sshd " + keys + " && ssh-keygen -q -t ed25519 -N '' -f " +
                           keys + "/host && ssh-keygen -q -t ed25519 -N '' -f " + keys +
                           "/user && cp " + keys + "/user.pub " + keys + "/authorized_keys");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  for (int host = 0; host < 2; ++host) {
    const auto sshd = testing::run_command(
        on(host, std::string("/usr/sbin/sshd -f /dev/null -h ") + keys + "/host -o ListenAddress=" +
                     kAddress[host] + " -o Port=2222 -o AuthorizedKeysFile=" + keys +
                     "/authorized_keys -o StrictModes=no -o UsePAM=no -o PidFile=" + keys +
                     "/sshd" + std::to_string(host) + ".pid"));
    ASSERT_EQ(sshd.exit_code, 0) << sshd.output;
  }
  const std::string hostfile = (dir_ / "hostfile").string();
  std::ofstream(hostfile) << "# two namespace hosts\n10.99.0.1 slots=2\n10.99.0.2 slots=2\n";
  const std::string launch = testing::cli() + " launch --hostfile " + hostfile +
                             " --kill-timeout 2 --ssh 'ssh -i " + keys +
                             "/user -p 2222 -o BatchMode=yes -o StrictHostKeyChecking=no " +
                             "-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR' -- ";

  const auto run = testing::run_command(
      on(0, launch + train("--set parallel.strategy=ddp --set train.micro_batch=2 --set run.dir=" +
                           (dir_ / "ssh").string())));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("[10.99.0.1:rank 0] "), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("[10.99.0.2:rank 2] "), std::string::npos) << run.output;
  EXPECT_EQ(testing::rank0_losses(dir_ / "ssh" / "metrics.jsonl").size(), 3u);

  // A long run, interrupted once it trains: every rank on both hosts stops.
  const fs::path metrics = dir_ / "interrupted" / "metrics.jsonl";
  const std::string log = (dir_ / "interrupted.log").string();
  const auto started = testing::run_command(
      on(0, launch + train("--set parallel.strategy=ddp --set train.micro_batch=2 "
                           "--set train.steps=1000000 --set run.dir=" +
                           (dir_ / "interrupted").string())) +
      " > " + log + " 2>&1 & echo $!");
  const int launcher = std::atoi(started.output.c_str());
  ASSERT_GT(launcher, 0) << started.output;
  ASSERT_TRUE(wait_until(120, [&] { return fs::exists(metrics) && fs::file_size(metrics) > 0; }))
      << read_file(log);
  ASSERT_EQ(trainers_on(0).size(), 2u);
  ASSERT_EQ(trainers_on(1).size(), 2u);
  kill(launcher, SIGINT);
  EXPECT_TRUE(wait_until(60, [&] { return !testing::alive(launcher); })) << read_file(log);
  EXPECT_TRUE(wait_until(10, [&] { return trainers_on(0).empty() && trainers_on(1).empty(); }))
      << read_file(log);
  EXPECT_NE(read_file(log).find("interrupted by signal 2; stopped the ranks of every host"),
            std::string::npos)
      << read_file(log);
}

TEST_F(TwoHostsTest, AHostWhoseRanksAreKilledRestartsBothHostsFromTheLatestCheckpoint) {
  const std::string settings =
      "--set parallel.strategy=ddp --set train.micro_batch=2 --set train.steps=300 "
      "--set train.checkpoint_every=20 --set run.dir=";
  const auto straight = two_hosts("", settings + (dir_ / "straight").string());
  ASSERT_EQ(straight.exit_code, 0) << straight.output;

  const fs::path run = dir_ / "restarted";
  start_node(1, "--max-restarts 1 --kill-timeout 2", settings + run.string());
  start_node(0, "--max-restarts 1 --kill-timeout 2", settings + run.string());
  ASSERT_TRUE(wait_until(120, [&] { return fs::exists(run / "checkpoints" / "step_000020"); }));
  const auto victims = trainers_on(1);
  ASSERT_EQ(victims.size(), 2u);
  for (int pid : victims) kill(pid, SIGKILL);
  const Ended zero = wait_node(0);
  const Ended one = wait_node(1);
  const std::string output = both_outputs(zero, one);
  ASSERT_EQ(zero.exit_code, 0) << output;
  ASSERT_EQ(one.exit_code, 0) << output;
  EXPECT_NE(zero.output.find("restarting (1 of 1)"), std::string::npos) << output;
  EXPECT_NE(one.output.find("restarting (1 of 1)"), std::string::npos) << output;
  EXPECT_NE(zero.output.find("resumed from"), std::string::npos) << output;
  const auto want = tensors_of(dir_ / "straight" / "checkpoints" / "step_000300");
  const auto got = tensors_of(run / "checkpoints" / "step_000300");
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, tensor] : want) EXPECT_TRUE(at::equal(got.at(name), tensor)) << name;
}

// rank 0's loss by step, from a metrics file.
std::map<int, double> rank0_losses(const fs::path& metrics) {
  std::map<int, double> out;
  std::istringstream lines(read_file(metrics));
  for (std::string line; std::getline(lines, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.at("rank") == 0) out[j.at("step").get<int>()] = j.at("loss").get<double>();
  }
  return out;
}

TEST_F(TwoHostsTest, AnElasticJobFinishesOnTheHostThatRemainsWithTheSameGlobalBatch) {
  // 8 sequences per step: 4 ranks x micro-batch 2 on two hosts, 2 ranks x 2 x 2 on one.
  const fs::path run = dir_ / "elastic";
  const std::string settings =
      "--set parallel.strategy=ddp --set train.micro_batch=2 --set train.global_batch=8 "
      "--set train.steps=300 --set train.checkpoint_every=20 --set train.keep_checkpoints=100 "
      "--set run.dir=";
  const std::string flags = "--max-restarts 1 --kill-timeout 2 --timeout 10";
  start_node(1, flags, settings + run.string(), "1:2");
  start_node(0, flags, settings + run.string(), "1:2");
  ASSERT_TRUE(wait_until(120, [&] { return fs::exists(run / "checkpoints" / "step_000020"); }));
  // Host 1 is lost for good: its launcher and its ranks die at once.
  testing::run_command("ip netns pids " + ns_[1] + " | xargs -r kill -9");
  const Ended zero = wait_node(0);
  const Ended one = wait_node(1);
  const std::string output = both_outputs(zero, one);
  ASSERT_EQ(zero.exit_code, 0) << output;
  EXPECT_NE(one.exit_code, 0) << output;
  EXPECT_NE(zero.output.find("restarting on 1 node (0) of --nnodes 1:2"), std::string::npos)
      << output;
  // The restart resumed the latest checkpoint on 2 ranks with 2 micro-batches per step.
  const std::string resumed = "resumed from ";
  const size_t at = zero.output.find(resumed);
  ASSERT_NE(at, std::string::npos) << output;
  const std::string checkpoint = zero.output.substr(
      at + resumed.size(), zero.output.find(" at step", at) - at - resumed.size());
  const int step = std::stoi(checkpoint.substr(checkpoint.rfind('_') + 1));
  const auto manifest = nlohmann::json::parse(read_file(run / "run.json"));
  EXPECT_EQ(manifest.at("world_size"), 2) << manifest.dump();
  EXPECT_EQ(manifest.at("train").at("grad_accum"), 2) << manifest.dump();

  // The same checkpoint resumed by a job of one host from the start: the same losses.
  const fs::path again = dir_ / "again";
  const auto reference = testing::run_command(
      on(0, testing::cli() + " launch --nproc 2 -- " +
                train(settings + again.string() + " --set run.resume=" + checkpoint)));
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  const auto want = rank0_losses(again / "metrics.jsonl");
  const auto got = rank0_losses(run / "metrics.jsonl");
  ASSERT_EQ(want.size(), static_cast<size_t>(300 - step)) << reference.output;
  for (const auto& [s, loss] : want) EXPECT_EQ(got.at(s), loss) << "step " << s;
  ASSERT_EQ(got.size(), 300u);
}

// hybrid_shard under replica fault tolerance, one replica (a 2-rank shard group) per host.
const char* const kReplicaPerHost =
    "--set parallel.strategy=fsdp --set parallel.fsdp.sharding=hybrid_shard "
    "--set parallel.fsdp.replicate=2 --set train.micro_batch=2 "
    "--set run.fault_tolerance=replicas --set run.log_every=100 ";

// Replica fault tolerance across hosts: hybrid_shard with one replica (a 2-rank shard group) per
// host. Rank 3, on host 1, dies after step 3: host 1's launcher restarts its replica alone, host
// 0's ranks train on in their first processes, and the restarted replica heals from host 0's.
TEST_F(TwoHostsTest, AReplicaOfOneHostIsRestartedByItsLauncherAndHealsFromTheOtherHost) {
  const fs::path run = dir_ / "replicas";
  const auto [zero, one] =
      run_both("--fault-tolerance --max-restarts 2 --kill-timeout 2 --timeout 60",
               std::string(kReplicaPerHost) + "--set train.steps=300 --set run.dir=" + run.string(),
               "SHARDTRAIN_KILL_AFTER_STEP=3");
  const std::string output = both_outputs(zero, one);
  ASSERT_EQ(zero.exit_code, 0) << output;
  ASSERT_EQ(one.exit_code, 0) << output;
  EXPECT_NE(one.output.find("restarting replica 1 (ranks 2,3) alone (1 of 2)"), std::string::npos)
      << output;
  EXPECT_EQ(zero.output.find("restarting replica"), std::string::npos) << output;
  testing::expect_healed(testing::replica_metrics(run / "metrics.jsonl"), 4, 300, 3, 2);
}

// A failure a host's launcher does not restart (past --max-restarts) ends the job on every host,
// each saying why.
TEST_F(TwoHostsTest, AReplicaFailurePastMaxRestartsEndsEveryHostWithItsReason) {
  const auto [zero, one] =
      run_both("--fault-tolerance --max-restarts 0 --kill-timeout 2 --timeout 60",
               std::string(kReplicaPerHost) +
                   "--set train.steps=1000000 --set run.dir=" + (dir_ / "run").string(),
               "SHARDTRAIN_KILL_AFTER_STEP=3", 120);
  const std::string output = both_outputs(zero, one);
  EXPECT_NE(zero.exit_code, 0) << output;
  EXPECT_NE(one.exit_code, 0) << output;
  const std::string why = "replica 1 failed after 0 restarts of --max-restarts 0";
  EXPECT_NE(one.output.find(why), std::string::npos) << output;
  EXPECT_NE(zero.output.find("node 1: rank 3 (pid "), std::string::npos) << output;
  EXPECT_NE(zero.output.find(why), std::string::npos) << output;
  EXPECT_NE(zero.output.find("stopped this node's ranks"), std::string::npos) << output;
}

TEST_F(TwoHostsTest, ALinkTakenDownEndsBothHostsWithinTheTimeoutNamingTheOtherHost) {
  const std::string settings =
      "--set parallel.strategy=ddp --set train.micro_batch=2 --set train.steps=1000000 "
      "--set run.dir=" +
      (dir_ / "run").string();
  start_node(1, "--timeout 10 --kill-timeout 1", settings);
  start_node(0, "--timeout 10 --kill-timeout 1", settings);
  const fs::path metrics = dir_ / "run" / "metrics.jsonl";
  ASSERT_TRUE(wait_until(120, [&] { return fs::exists(metrics) && fs::file_size(metrics) > 0; }));
  const double down = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  const auto result = testing::run_command("ip -n " + ns_[1] + " link set " + link_ + " down");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const Ended zero = wait_node(0, 60);
  const Ended one = wait_node(1, 60);
  const std::string output = both_outputs(zero, one);
  EXPECT_NE(zero.exit_code, 0) << output;
  EXPECT_NE(one.exit_code, 0) << output;
  EXPECT_LT(zero.at - down, 15.0) << output;
  EXPECT_LT(one.at - down, 15.0) << output;
  EXPECT_NE(zero.output.find("at 10.99.0.2"), std::string::npos) << output;
  EXPECT_NE(one.output.find("at 10.99.0.1"), std::string::npos) << output;
}

}  // namespace multihost_test
}  // namespace shardtrain
