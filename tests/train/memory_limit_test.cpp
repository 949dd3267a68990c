// Sharding that lowers memory, judged by the kernel: four ranks, each in its own memory cgroup
// whose limit is below the model's training state (16 bytes per parameter). full_shard and
// ZeRO-3 train under it; DDP is refused before it allocates, naming a strategy that fits.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "shardtrain/config.h"
#include "support.h"
#include "train/memory_check.h"
#include "train/run_setup.h"

namespace shardtrain {
namespace memory_limit_test {

namespace fs = std::filesystem;
using testing::cli;
using testing::run_command;

// 71.4M parameters: 1.14 GB of fp32 parameters, gradients and AdamW moments.
constexpr const char* kModel =
    "[model]\npreset = \"tiny\"\nd_model = 704\nn_layers = 12\nn_heads = 11\nffn_hidden = 2816\n"
    "context_length = 32\n";
constexpr int64_t kLimitMiB = 1024;

class MemoryLimitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // cgroup v1's memory controller, as on this project's machines; elsewhere, say so and skip.
    cgroups_ = "/sys/fs/cgroup/memory/shardtrain_test_" + std::to_string(getpid());
    std::error_code error;
    if (!fs::create_directory(cgroups_, error)) {
      GTEST_SKIP() << "cannot create a memory cgroup under /sys/fs/cgroup/memory ("
                   << error.message()
                   << "): this test needs cgroup v1's memory controller and permission to use it";
    }
    dir_ = testing::fresh_test_dir("shardtrain_memory_limit");
    std::ofstream(dir_ / "config.toml")
        << kModel << "[data]\ncorpus = [\"" << SHARDTRAIN_SOURCE_DIR
        << "/README.md\"]\ntokenizer = \"byte\"\nseq_len = 16\neval_sequences = 4\n"
        << "[train]\nsteps = 2\nmicro_batch = 1\neval_every = 0\nsample_tokens = 0\n"
        << "[run]\nthreads = 1\n";
  }
  void TearDown() override {
    for (int r = 0; r < 4; ++r) fs::remove(cgroups_ / ("rank_" + std::to_string(r)));
    fs::remove(cgroups_);
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  // Starts 4 ranks from the environment (as torchrun would), each moved into its own cgroup
  // limited to kLimitMiB before it execs the trainer. Returns each rank's exit status and output.
  std::vector<testing::CommandResult> train(const std::string& name, const std::string& flags) {
    const int port = testing::free_port();
    std::vector<std::string> commands;
    for (int r = 0; r < 4; ++r) {
      const fs::path group = cgroups_ / ("rank_" + std::to_string(r));
      fs::create_directories(group);
      std::ofstream(group / "memory.limit_in_bytes") << kLimitMiB * 1024 * 1024;
      commands.push_back("RANK=" + std::to_string(r) + " LOCAL_RANK=" + std::to_string(r) +
                         " WORLD_SIZE=4 LOCAL_WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                         std::to_string(port) + " sh -c 'echo $$ > " +
                         (group / "cgroup.procs").string() + " && exec " + cli() +
                         " train --config " + (dir_ / "config.toml").string() +
                         " --set run.dir=\\\"" + (dir_ / name).string() + "\\\" " + flags + "' > " +
                         (dir_ / (name + "." + std::to_string(r) + ".log")).string() + " 2>&1");
    }
    // All four at once, then each one's status.
    std::string script;
    for (int r = 0; r < 4; ++r)
      script += "( " + commands[r] + " ) & p" + std::to_string(r) + "=$!; ";
    for (int r = 0; r < 4; ++r) script += "wait $p" + std::to_string(r) + "; echo \"status $?\"; ";
    const testing::CommandResult all = run_command("bash -c " + quote(script));
    std::vector<testing::CommandResult> ranks(4);
    size_t at = 0;
    for (int r = 0; r < 4; ++r) {
      at = all.output.find("status ", at);
      if (at == std::string::npos) break;
      ranks[r].exit_code = std::stoi(all.output.substr(at + 7));
      at += 7;
      std::ifstream log(dir_ / (name + "." + std::to_string(r) + ".log"));
      ranks[r].output.assign(std::istreambuf_iterator<char>(log), {});
    }
    return ranks;
  }

  static std::string quote(const std::string& text) {
    std::string out = "'";
    for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
  }

  fs::path cgroups_, dir_;
};

TEST_F(MemoryLimitTest, ShardedStrategiesTrainWhereDdpIsRefusedBeforeItAllocates) {
  const auto ddp = train("ddp", "--set parallel.strategy=ddp");
  for (int r = 0; r < 4; ++r) {
    SCOPED_TRACE("ddp rank " + std::to_string(r) + ": " + ddp[r].output);
    EXPECT_EQ(ddp[r].exit_code, 2);
    EXPECT_NE(
        ddp[r].output.find("out of memory before the start: DDP (parallel.strategy = \"ddp\")"),
        std::string::npos);
    EXPECT_NE(ddp[r].output.find("memory cgroup's limit"), std::string::npos);
    EXPECT_NE(ddp[r].output.find("set parallel.strategy = \"fsdp\" (full_shard)"),
              std::string::npos);
  }
  EXPECT_FALSE(fs::exists(dir_ / "ddp" / "metrics.jsonl"));

  for (const std::string& strategy :
       {std::string("--set parallel.strategy=fsdp --set parallel.fsdp.sharding=full_shard"),
        // DeepSpeed's default prefetch (5e7 elements) would keep most of the blocks gathered:
        // a memory-bound ZeRO-3 run prefetches less (with the default, 900 MiB is not enough).
        std::string("--set parallel.strategy=zero --set parallel.zero.stage=3 "
                    "--set parallel.zero.prefetch_bucket_size=10000000")}) {
    const std::string name = strategy.find("fsdp") != std::string::npos ? "fsdp" : "zero3";
    const auto ranks = train(name, strategy);
    for (int r = 0; r < 4; ++r) {
      SCOPED_TRACE(name + " rank " + std::to_string(r) + ": " + ranks[r].output);
      EXPECT_EQ(ranks[r].exit_code, 0);  // 137: the kernel killed it at the limit
    }
    EXPECT_EQ(testing::rank0_losses(dir_ / name / "metrics.jsonl").size(), 2u);
    // The kernel held each rank to the limit; what made room is each rank's quarter of the
    // training state (peak RSS also counts shared library pages charged elsewhere).
    std::ifstream metrics(dir_ / name / "metrics.jsonl");
    for (std::string line; std::getline(metrics, line);) {
      const auto mem = nlohmann::json::parse(line).at("mem");
      const double state =
          mem["params"].get<double>() + mem["grads"].get<double>() + mem["optim"].get<double>();
      EXPECT_LT(state, 0.26 * 1.14e9) << line;
    }
  }
}

TEST(MemoryCheck, ALimitTooSmallForAnyStrategyNamesTheBytesAndTheStrategy) {
  const TrainConfig config =
      parse_train_config(std::string(kModel) +
                             "[data]\ncorpus = [\"x\"]\nseq_len = 16\n[train]\nmicro_batch = 1\n"
                             "[parallel]\nstrategy = \"zero\"\nzero.stage = 3\n",
                         "t.toml", {});
  const int64_t held = detail::resident_bytes();
  detail::MemoryBudget budget;
  budget.bytes = 100000000;
  budget.source = "a test's budget";
  try {
    detail::check_memory_fits(config, 4, budget, held);
    FAIL() << "a 71M-parameter model fitted in 100 MB per rank";
  } catch (const std::invalid_argument& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("ZeRO-3 / FSDP full_shard (parallel.strategy = \"zero\") on 4 ranks "
                           "needs about"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("each rank here may use 0.10 GB (a test's budget)"), std::string::npos)
        << message;
    EXPECT_NE(message.find("No data-parallel strategy fits on 4 ranks"), std::string::npos)
        << message;
  }
  budget.bytes = 64LL << 30;  // room for anything
  EXPECT_NO_THROW(detail::check_memory_fits(config, 4, budget, held));
  budget.bytes = -1;  // nothing known limits it
  EXPECT_NO_THROW(detail::check_memory_fits(config, 4, budget, held));
  // One process without a strategy is named as what it is, on one rank.
  const TrainConfig alone = parse_train_config(
      std::string(kModel) + "[data]\ncorpus = [\"x\"]\nseq_len = 16\n[train]\nmicro_batch = 1\n",
      "t.toml", {});
  budget.bytes = 100000000;
  try {
    detail::check_memory_fits(alone, 1, budget, held);
    FAIL() << "a 71M-parameter model fitted in 100 MB";
  } catch (const std::invalid_argument& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("training in one process (parallel.strategy = \"none\") on 1 rank "
                           "needs about"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("No data-parallel strategy fits on 1 rank:"), std::string::npos)
        << message;
  }
}

}  // namespace memory_limit_test
}  // namespace shardtrain
