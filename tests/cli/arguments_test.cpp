// Every subcommand's options take paths and words of every length, ASCII or not. Each option
// writes into storage that must outlive parsing; a use of freed storage is made to fail for
// certain: while the command line runs here, memory freed with sized delete is poisoned and held
// back rather than reused, so a write through a dangling string crashes the test.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>
#include <sstream>

#include "app.h"
#include "support.h"

namespace {

std::atomic<bool> g_poison_freed{false};
constexpr size_t kHeldCapacity = 1 << 20;
void* g_held[kHeldCapacity];
std::atomic<size_t> g_held_count{0};

// Frees what was held back while poisoning was on.
void release_held() {
  const size_t n = g_held_count.exchange(0);
  for (size_t i = 0; i < std::min(n, kHeldCapacity); ++i) std::free(g_held[i]);
}

}  // namespace

#ifndef __SANITIZE_ADDRESS__
// The default operator new allocates with malloc, so free() pairs with it. (AddressSanitizer
// builds keep its own operator delete, which finds a use of freed memory by itself.)
void operator delete(void* p, std::size_t size) noexcept {
  if (p && g_poison_freed.load(std::memory_order_relaxed)) {
    std::memset(p, 0xdb, size);
    const size_t slot = g_held_count.fetch_add(1);
    if (slot < kHeldCapacity) {
      g_held[slot] = p;
      return;
    }
  }
  std::free(p);
}
void operator delete(void* p) noexcept { std::free(p); }
#endif

namespace shardtrain {
namespace arguments_test {

namespace fs = std::filesystem;

struct Outcome {
  int status = -1;
  std::string err;
};

// Runs the command line in-process with freed memory poisoned and held back.
Outcome run_cli(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  g_poison_freed = true;
  const int status = cli::run(args, out, err);
  g_poison_freed = false;
  release_held();
  return {status, err.str()};
}

// `count` repetitions of `unit` (a multi-byte character for non-ASCII names).
std::string repeat(const std::string& unit, int count) {
  std::string text;
  for (int i = 0; i < count; ++i) text += unit;
  return text;
}

class CliArgumentsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::fresh_test_dir("shardtrain_cli_args");
    previous_ = fs::current_path();
    fs::current_path(dir_);  // relative names of every length land here
  }
  void TearDown() override {
    fs::current_path(previous_);
    fs::remove_all(dir_);
  }

  // Every subcommand, with `a` and `b` as the paths or words it takes, and the status each
  // must end with (none of these names exists: each is refused with a message naming it).
  static void check_every_subcommand(const std::string& a, const std::string& b) {
    struct Case {
      std::vector<std::string> args;
      int status;
      bool named;  // the message names `a`
    };
    const std::vector<Case> cases = {
        {{"ckpt", "export", a, "--format", "hf", b}, 2, true},
        {{"ckpt", "export", b, "--format", "hf", a}, 2, false},
        {{"ckpt", "inspect", a, "--verify"}, 2, true},
        {{"ckpt", "reshard", a, b, "--world-size", "2"}, 2, true},
        {{"train", "--config", a, "--set", "run.dir=" + b}, 2, true},
        {{"train", "--config", a, "--deepspeed", b, "--accelerate-config", b}, 2, false},
        {{"data", "prepare", "--corpus", a, "--out", b, "--tokenizer", "byte", "--gpt2-dir", b},
         2,
         true},
        {{"data", "prepare", "--corpus", a, "--out", b, "--format", "chat", "--tokenizer", b},
         2,
         false},
        {{"data", "tokenize", "--tokenizer", a}, 2, true},
        {{"data", "tokenize", "--tokenizer", "byte", "--chat", b, "--chat-template", a}, 2, true},
        {{"generate", a, "--tokenizer", b, "--chat-template", b, "--prompt", b}, 2, true},
        {{"plan", "--model", a, "--out", b, "--chart", b}, 2, true},
        {{"plan", "--validate", a}, 2, true},
        {{"bench", "collectives", "--op", a}, 2, true},
        {{"bench", "adam", "--params", a, "--nvme-dir", b}, 2, true},
        {{"bench", "scaling", "--config", a, "--out", b}, 2, true},
        {{"report", a, "--out", b}, 2, true},
        {{"trace", "merge", a, "--out", b}, 2, true},
        {{"launch", "--nproc", a, "--", b}, 2, true},
        {{"launch", "--nproc", "1", "--master-addr", b, "--", "./" + a}, 127, false},
    };
    for (const auto& c : cases) {
      const Outcome got = run_cli(c.args);
      std::string line;
      for (const auto& word : c.args) line += word + " ";
      ASSERT_EQ(got.status, c.status) << line << "\n" << got.err;
      if (c.named) {
        EXPECT_NE(got.err.find(a), std::string::npos) << line << "\n" << got.err;
      }
    }
  }

  fs::path dir_;
  fs::path previous_;
};

TEST_F(CliArgumentsTest, EverySubcommandTakesNamesOfEveryLength) {
  for (int length = 1; length <= 300; ++length) {
    SCOPED_TRACE("length " + std::to_string(length));
    check_every_subcommand(repeat("a", length), repeat("o", length));
    if (HasFatalFailure()) return;
  }
}

TEST_F(CliArgumentsTest, EverySubcommandTakesNonAsciiNames) {
  for (const std::string unit : {"\xc3\xbc", "\xe6\x97\xa5\xe6\x9c\xac", "\xf0\x9f\x90\xa7"}) {
    for (int count = 1; count <= 100; count += 3) {
      SCOPED_TRACE(repeat(unit, count));
      check_every_subcommand(repeat(unit, count), "out_" + repeat(unit, count));
      if (HasFatalFailure()) return;
    }
  }
}

// The commands the crash was reported with, through the real program: the export is written.
TEST_F(CliArgumentsTest, ExportWritesToOutputFoldersOfAnyLength) {
  const auto trained = testing::run_command(
      testing::cli() + " train --config " + SHARDTRAIN_SOURCE_DIR +
      "/configs/demo.toml --set model.preset=tiny --set train.steps=2 --set "
      "train.checkpoint_every=2 --set train.sample_tokens=0 --set data.tokenizer=byte --set "
      "data.seq_len=32 --set data.eval_sequences=4 --set train.eval_every=0 --set "
      "data.corpus=" +
      SHARDTRAIN_SOURCE_DIR + "/README.md --set run.dir=" + (dir_ / "s1").string());
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const fs::path deep = dir_ / repeat("a", 30);
  fs::create_directories(deep);
  fs::copy(dir_ / "s1", deep / "s1", fs::copy_options::recursive);
  for (const auto& [from, out] : std::vector<std::pair<fs::path, std::string>>{
           {deep / "s1", "xo2"},
           {dir_ / "s1", (deep / "out_long_name").string()},
           {dir_ / "s1", repeat("o", 40)},
           {dir_ / "s1", repeat("o", 55)}}) {
    const auto exported = testing::run_command(
        testing::cli() + " ckpt export " + (from / "checkpoints").string() + " --format hf " + out);
    ASSERT_EQ(exported.exit_code, 0) << exported.output;
    EXPECT_TRUE(fs::exists(fs::path(out) / "model.safetensors")) << out;
  }
}

}  // namespace arguments_test
}  // namespace shardtrain
