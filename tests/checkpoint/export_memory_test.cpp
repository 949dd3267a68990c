// `shardtrain ckpt export` streams: its peak resident memory (VmHWM) on a model of a few hundred
// MB stays under twice the largest tensor above the fixed cost of the process (measured as the
// peak of `ckpt inspect` on the same checkpoint, which loads only the index).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "shardtrain/hf.h"
#include "shardtrain/sharded_checkpoint.h"
#include "support.h"

namespace shardtrain {
namespace export_memory_test {

namespace fs = std::filesystem;

// VmHWM (peak resident set) of a process, from /proc; -1 when absent.
int64_t peak_resident_of(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

// Peak resident bytes of the CLI run with `args`, and its exit status. The child is traced so
// that it stops just before it exits, while its memory map still exists: its VmHWM then covers
// the program's whole run and nothing before exec (wait4's ru_maxrss would also count the
// pages the child shared with this process between fork and exec).
std::pair<int64_t, int> peak_rss_of_cli(const std::vector<std::string>& args) {
  std::vector<std::string> argv_text = {testing::cli()};
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, STDOUT_FILENO);
    ptrace(PTRACE_TRACEME, 0, nullptr, nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);  // stopped at exec
  ptrace(PTRACE_SETOPTIONS, pid, nullptr, reinterpret_cast<void*>(PTRACE_O_TRACEEXIT));
  ptrace(PTRACE_CONT, pid, nullptr, nullptr);
  int64_t peak = -1;
  while (waitpid(pid, &status, 0) == pid && WIFSTOPPED(status)) {
    int forward = 0;
    if (status >> 8 == (SIGTRAP | (PTRACE_EVENT_EXIT << 8))) {
      peak = peak_resident_of(pid);
    } else if (WSTOPSIG(status) != SIGTRAP) {
      forward = WSTOPSIG(status);  // a signal for the program itself
    }
    ptrace(PTRACE_CONT, pid, nullptr, reinterpret_cast<void*>(static_cast<intptr_t>(forward)));
  }
  return {peak, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

TEST(ExportMemoryTest, PeakMemoryStaysNearTheLargestTensor) {
  const fs::path dir = testing::fresh_test_dir("shardtrain_export_mem");
  ModelConfig config = model_preset("tiny");
  config.name = "custom";
  config.vocab_size = 8192;
  config.context_length = 1024;
  config.d_model = 1024;
  config.n_heads = 16;
  config.n_kv_heads = 16;
  config.ffn_hidden = 4096;
  config.n_layers = 5;
  // Synthetic data: every slice views one shared buffer, so this process stays small while the
  // checkpoint holds every tensor in full.
  const at::Tensor pool = at::randn({8 << 20});
  std::vector<TensorSpec> specs;
  std::vector<FlatSlice> slices;
  int64_t total = 0, largest = 0;
  for (const auto& p : config.parameter_shapes()) {
    specs.push_back({p.name, p.shape, at::kFloat});
    for (int64_t at = 0; at < p.numel(); at += pool.numel()) {
      slices.push_back({p.name, at, pool.narrow(0, 0, std::min(pool.numel(), p.numel() - at))});
    }
    total += p.numel() * 4;
    largest = std::max(largest, p.numel() * 4);
  }
  ASSERT_GT(total, 250 << 20);
  ASSERT_LT(largest, total / 6);  // loading the whole model would break the bound
  nlohmann::json description = {{"family", "gpt2"},
                                {"vocab_size", config.vocab_size},
                                {"context_length", 1024},
                                {"d_model", 1024},
                                {"n_layers", config.n_layers},
                                {"n_heads", 16},
                                {"n_kv_heads", 16},
                                {"ffn_hidden", 4096},
                                {"norm_eps", 1e-5},
                                {"rope_theta", 10000.0},
                                {"dropout", 0.0},
                                {"tie_embeddings", true}};
  const std::string ckpt = save_sharded_checkpoint(
      (dir / "root").string(), "step_000001", specs, slices, nullptr,
      ShardedSaveOptions().metadata(nlohmann::json({{"model", description}}).dump()));

  const auto [baseline, inspect_status] = peak_rss_of_cli({"ckpt", "inspect", ckpt});
  ASSERT_EQ(inspect_status, 0);
  const auto [peak, export_status] =
      peak_rss_of_cli({"ckpt", "export", ckpt, "--format", "hf", (dir / "hf").string()});
  ASSERT_EQ(export_status, 0);
  EXPECT_GT(fs::file_size(dir / "hf" / "model.safetensors"), static_cast<uintmax_t>(total));
  // The fixed cost is the inspect run's peak plus room for malloc's per-thread arenas, which
  // LibTorch's intra-op threads touch differently from run to run.
  const int64_t fixed = baseline + (16 << 20);
  EXPECT_LT(peak, fixed + 2 * largest)
      << "export peak " << (peak >> 20) << " MiB, inspect peak " << (baseline >> 20)
      << " MiB, largest tensor " << (largest >> 20) << " MiB, model " << (total >> 20) << " MiB";
  std::printf(
      "export peak RSS %lld MiB (inspect %lld MiB), largest tensor %lld MiB, model %lld MiB\n",
      static_cast<long long>(peak >> 20), static_cast<long long>(baseline >> 20),
      static_cast<long long>(largest >> 20), static_cast<long long>(total >> 20));
  fs::remove_all(dir);
}

}  // namespace export_memory_test
}  // namespace shardtrain
