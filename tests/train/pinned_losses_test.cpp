// Pinned losses: every supported layout trains the model of tests/assets/losses/run.toml for six
// steps through the command line, and rank 0's losses must equal, bit for bit, the ones committed
// in tests/assets/losses/LAYOUT.txt (hexadecimal floats). A checkpoint written by an earlier
// version (tests/assets/checkpoints/fsdp_full_shard_2_step3) must still resume to its pinned
// losses. `bash scripts/pin_losses.sh` rewrites the files when a change is meant to alter the
// numerics; the commit that does so says why.
//
// Bits depend on the machine's kernels (its BLAS and vector width) as well as on the code: the
// pinning machine's kernel fingerprint is committed with the losses, and a machine whose kernels
// round differently compares within a relative 1e-3 instead, saying so.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "support.h"

namespace shardtrain {
namespace pinned_losses_test {

namespace fs = std::filesystem;

struct PinnedLayout {
  std::string name;
  int ranks = 1;
  std::vector<std::string> settings;  // section.key=value; {tmp} is the test's directory
};

void PrintTo(const PinnedLayout& layout, std::ostream* out) { *out << layout.name; }

std::vector<PinnedLayout> pinned_layouts() {
  const std::string fsdp = "parallel.strategy=fsdp", zero = "parallel.strategy=zero";
  const std::string pp2 = "parallel.pp=2", accum4 = "train.grad_accum=4";
  return {
      {"none", 1, {}},
      {"ddp_2", 2, {"parallel.strategy=ddp"}},
      {"fsdp_full_shard_2", 2, {fsdp}},
      {"fsdp_full_shard_3", 3, {fsdp}},
      {"fsdp_shard_grad_op_2", 2, {fsdp, "parallel.fsdp.sharding=shard_grad_op"}},
      {"fsdp_shard_grad_op_3", 3, {fsdp, "parallel.fsdp.sharding=shard_grad_op"}},
      {"fsdp_no_shard_2", 2, {fsdp, "parallel.fsdp.sharding=no_shard"}},
      {"fsdp_no_shard_3", 3, {fsdp, "parallel.fsdp.sharding=no_shard"}},
      {"fsdp_hybrid_2x2",
       4,
       {fsdp, "parallel.fsdp.sharding=hybrid_shard", "parallel.fsdp.replicate=2"}},
      {"zero1_2", 2, {zero, "parallel.zero.stage=1"}},
      {"zero2_2", 2, {zero, "parallel.zero.stage=2"}},
      {"zero3_2", 2, {zero, "parallel.zero.stage=3"}},
      {"zero3_nvme_2",
       2,
       {zero, "parallel.zero.stage=3", "parallel.zero.offload_optimizer=nvme",
        "parallel.zero.offload_param=nvme", "parallel.zero.nvme_path={tmp}/nvme"}},
      {"tp2_sequence_parallel", 2, {"parallel.tp=2", "parallel.sequence_parallel=true"}},
      {"pp2_gpipe", 2, {pp2, accum4, "parallel.pp_schedule=gpipe"}},
      {"pp2_1f1b", 2, {pp2, accum4, "parallel.pp_schedule=1f1b"}},
      {"pp2_interleaved_1f1b",
       2,
       {pp2, accum4, "parallel.pp_schedule=interleaved_1f1b", "parallel.pp_virtual_stages=2"}},
      {"pp2_zero_bubble", 2, {pp2, accum4, "parallel.pp_schedule=zero_bubble"}},
      {"pp2_tp2", 4, {pp2, accum4, "parallel.tp=2"}},
      {"pp2_fsdp2", 4, {pp2, accum4, fsdp}},
      {"lora_fsdp_2", 2, {fsdp, "lora.rank=4"}},
      {"qlora", 1, {"lora.rank=4", "lora.base_dtype=nf4"}},
      {"autocast_bf16", 1, {"precision.autocast=bf16"}},
      {"grad_accum_4", 1, {accum4}},
      {"activation_checkpointing", 1, {"train.activation_checkpointing=true"}},
  };
}

const fs::path kAssets = fs::path(SHARDTRAIN_SOURCE_DIR) / "tests" / "assets";
const fs::path kLosses = kAssets / "losses";
const fs::path kOldCheckpoint = kAssets / "checkpoints" / "fsdp_full_shard_2_step3";

bool pinning() { return std::getenv("SHARDTRAIN_PIN_LOSSES") != nullptr; }

// FNV-1a over the bytes of what this machine's LibTorch computes for fixed inputs through the
// kernels the runs use: matrix products, softmax, norms, activations, a long reduction, a cross
// entropy's backward, bf16 products and an AdamW-like update.
std::string kernel_fingerprint() {
  torch::NoGradGuard no_grad_outside;
  torch::manual_seed(20261124);
  std::vector<torch::Tensor> outputs;
  const auto x = torch::randn({64, 32}), w = torch::randn({96, 32}), b = torch::randn({96});
  outputs.push_back(torch::linear(x, w, b));
  const auto q = torch::randn({8, 32, 8}), k = torch::randn({8, 32, 8}),
             v = torch::randn({8, 32, 8});
  outputs.push_back(torch::bmm(torch::softmax(torch::bmm(q, k.transpose(1, 2)), -1), v));
  outputs.push_back(torch::layer_norm(x, {32}, w.slice(0, 0, 1).flatten(), b.slice(0, 0, 32)));
  outputs.push_back(x * torch::rsqrt(x.pow(2).mean(-1, true) + 1e-5));
  outputs.push_back(torch::gelu(x, "tanh"));
  outputs.push_back(torch::silu(x) * torch::tanh(x).exp());
  outputs.push_back(torch::randn({100003}).sum());
  outputs.push_back(
      torch::matmul(x.to(torch::kBFloat16), w.t().to(torch::kBFloat16)).to(torch::kFloat));
  const auto m = torch::randn({4096}), s = torch::rand({4096});
  outputs.push_back(m / (torch::sqrt(s) + 1e-8));
  {
    torch::AutoGradMode grad(true);
    const auto weight = torch::randn({264, 32}).requires_grad_(true);
    const auto targets = torch::randint(264, {64});
    torch::nn::functional::cross_entropy(torch::linear(x, weight), targets).backward();
    outputs.push_back(weight.grad());
  }
  uint64_t hash = 1469598103934665603ull;
  for (const auto& out : outputs) {
    const auto bytes = out.contiguous().to(torch::kFloat);
    const auto* p = static_cast<const unsigned char*>(bytes.data_ptr());
    for (int64_t i = 0; i < bytes.numel() * 4; ++i) hash = (hash ^ p[i]) * 1099511628211ull;
  }
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

std::string pinned_fingerprint() {
  std::ifstream in(kLosses / "kernels.txt");
  std::string word, value;
  while (in >> word) {
    if (word == "fingerprint" && in >> value) return value;
  }
  return "";
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

void write_losses(const fs::path& file, const std::vector<double>& losses) {
  std::ofstream out(file);
  char text[64];
  for (double loss : losses) {
    std::snprintf(text, sizeof(text), "%a", loss);
    out << text << "\n";
  }
}

std::vector<double> read_losses(const fs::path& file) {
  std::ifstream in(file);
  std::vector<double> out;
  for (std::string word; in >> word;) out.push_back(std::strtod(word.c_str(), nullptr));
  return out;
}

// Equal bits where this machine's kernels are the pinning machine's, else within 1e-3.
void expect_pinned(const std::vector<double>& got, const fs::path& file) {
  const auto want = read_losses(file);
  ASSERT_FALSE(want.empty()) << "no pinned losses in " << file << " (bash scripts/pin_losses.sh)";
  ASSERT_EQ(got.size(), want.size()) << file;
  static const std::string here = kernel_fingerprint(), pinned = pinned_fingerprint();
  const bool same_kernels = here == pinned;
  if (!same_kernels) {
    std::cout << "note: this machine's kernels round differently from those that pinned "
              << file.filename() << " (fingerprint " << here << " vs " << pinned
              << "): compared within 1e-3, not bit for bit\n";
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (same_kernels) {
      EXPECT_EQ(got[i], want[i]) << "step " << i + 1 << " of " << file << ": " << std::hexfloat
                                 << got[i] << " vs " << want[i];
    } else {
      EXPECT_NEAR(got[i], want[i], 1e-3 * std::abs(want[i])) << "step " << i + 1 << " of " << file;
    }
  }
}

// Trains `layout` under `dir` through `shardtrain launch` and returns rank 0's losses.
std::vector<double> train(const PinnedLayout& layout, const fs::path& dir,
                          const std::vector<std::string>& extra = {}) {
  fs::create_directories(dir / "nvme");
  std::string command = testing::cli() + " launch --nproc " + std::to_string(layout.ranks) +
                        " -- " + testing::cli() + " train --config " +
                        (kLosses / "run.toml").string() +
                        " --set data.corpus=" + (kLosses / "corpus.txt").string() +
                        " --set run.dir=" + (dir / "run").string();
  auto settings = layout.settings;
  settings.insert(settings.end(), extra.begin(), extra.end());
  for (std::string setting : settings) {
    const auto at = setting.find("{tmp}");
    if (at != std::string::npos) setting.replace(at, 5, dir.string());
    command += " --set " + setting;
  }
  const auto run = testing::run_command(command);
  EXPECT_EQ(run.exit_code, 0) << command << "\n" << run.output;
  return testing::rank0_losses(dir / "run" / "metrics.jsonl");
}

class PinnedLosses : public ::testing::TestWithParam<PinnedLayout> {
 protected:
  void SetUp() override { dir_ = testing::fresh_test_dir("shardtrain_pinned"); }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_P(PinnedLosses, SixStepsReplayThePinnedBits) {
  const PinnedLayout& layout = GetParam();
  const auto losses = train(layout, dir_);
  ASSERT_EQ(losses.size(), 6u);
  const fs::path file = kLosses / (layout.name + ".txt");
  if (!pinning()) return expect_pinned(losses, file);
  write_losses(file, losses);
  if (layout.name == "none") {
    std::ofstream(kLosses / "kernels.txt")
        << "fingerprint " << kernel_fingerprint() << "\n# pinned on: " << cpu_model()
        << ", LibTorch " << TORCH_VERSION << "\n";
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, PinnedLosses, ::testing::ValuesIn(pinned_layouts()),
                         [](const auto& info) { return info.param.name; });

// The checkpoint was written at step 3 of fsdp_full_shard_2 by an earlier version; resuming it
// replays steps 4 to 6. SHARDTRAIN_PIN_CHECKPOINT=1 (with SHARDTRAIN_PIN_LOSSES) writes a new one:
// only for a change that means old checkpoints no longer load, which its commit must say.
TEST(PinnedCheckpoint, AnEarlierVersionsCheckpointResumesToItsPinnedLosses) {
  const auto dir = testing::fresh_test_dir("shardtrain_pinned_checkpoint");
  const PinnedLayout fsdp2 = pinned_layouts()[2];
  ASSERT_EQ(fsdp2.name, "fsdp_full_shard_2");
  if (std::getenv("SHARDTRAIN_PIN_CHECKPOINT") != nullptr) {
    train(fsdp2, dir / "writer", {"train.checkpoint_every=3", "train.final_checkpoint=false"});
    fs::remove_all(kOldCheckpoint);
    fs::create_directories(kOldCheckpoint.parent_path());
    fs::copy(dir / "writer" / "run" / "checkpoints" / "step_000003", kOldCheckpoint);
  }
  ASSERT_TRUE(fs::exists(kOldCheckpoint / "index.json")) << kOldCheckpoint;
  fs::copy(kOldCheckpoint, dir / "checkpoint");  // resuming reads it; the tree stays as it was
  const auto tail = train(fsdp2, dir, {"run.resume=" + (dir / "checkpoint").string()});
  ASSERT_EQ(tail.size(), 3u);
  const fs::path file = kLosses / "fsdp_full_shard_2_resumed_at_3.txt";
  if (pinning()) {
    write_losses(file, tail);
  } else {
    expect_pinned(tail, file);
  }
  fs::remove_all(dir);
}

}  // namespace pinned_losses_test
}  // namespace shardtrain
