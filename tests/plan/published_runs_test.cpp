// The planner against published training runs: Megatron-LM's MFU tables (Narayanan et al. 2021
// on A100, the Megatron-Core H100 table of its README) and torchtitan's Llama 3.1 benchmarks.
// Each row is the run's own layout, evaluated as one candidate; docs/planner.md prints the same
// table ("Published runs").
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "shardtrain/plan.h"

namespace shardtrain {
namespace published_runs_test {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

enum class Ac { kNone, kSelective, kFull };

struct PublishedRun {
  const char* name;
  PlanModel model;
  const char* gpu;
  int gpus;  // in all, 8 per node
  PlanStrategy strategy;
  int tp, pp;
  int64_t seq_len, micro_batch, global_batch;
  Ac ac;
  bool fp32_grads;
  int virtual_stages;
  bool tp_overlap;
  double tokens_per_s_per_gpu;  // published, or from the published FLOP/s and the run's formula
  double memory_gib;            // published peak per device; 0: not published
  const char* why_not = "";     // why the estimate is outside the bounds, when it is
};

// A GPT of Megatron's tables: multi-head attention, a 4h GELU MLP, untied embeddings.
PlanModel megatron_gpt(int64_t layers, int64_t hidden, int64_t heads, int64_t vocab,
                       int64_t seq_len) {
  const double l = static_cast<double>(layers), h = static_cast<double>(hidden);
  // Narayanan et al. 2021's count, with biases and position embeddings.
  const double params =
      12 * l * h * h * (1 + 13 / (12 * h) + static_cast<double>(vocab + seq_len) / (12 * l * h));
  return PlanModel::from_shapes(static_cast<int64_t>(params), layers, hidden, heads, heads,
                                4 * hidden, vocab, false);
}

// Tokens/s per GPU from a published FLOP/s per GPU, counted as the source counts a token:
// Megatron's README 72lh^2(1 + s/6h + V/12lh); the 2021 paper with the recomputed forward,
// 96lh^2(1 + s/6h + V/16lh).
double megatron_tokens(double tflops, int64_t layers, int64_t hidden, int64_t vocab,
                       int64_t seq_len, bool with_recompute) {
  const double l = static_cast<double>(layers), h = static_cast<double>(hidden);
  const double s = static_cast<double>(seq_len), v = static_cast<double>(vocab);
  const double per_token = with_recompute ? 96 * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
                                          : 72 * l * h * h * (1 + s / (6 * h) + v / (12 * l * h));
  return tflops * 1e12 / per_token;
}

std::vector<PublishedRun> published_runs() {
  std::vector<PublishedRun> rows;
  // Megatron-LM README, "Performance Benchmarking" (Megatron-Core r0.8.0, H100, bf16, seq 4096,
  // vocabulary 131072, distributed optimizer, gradient and parameter-gather overlap, TP
  // communication overlap). Micro-batch 1, no recomputation and an interleaved schedule of one
  // layer per virtual stage are assumed: the table does not say.
  struct Mg {
    const char* name;
    int64_t heads, hidden, layers;
    int tp, pp, gpus;
    int64_t batch;
    double tflops;
  };
  const Mg h100[] = {{"1.7B", 16, 2048, 24, 1, 1, 48, 192, 408.8},
                     {"7.1B", 32, 4096, 30, 2, 1, 96, 192, 465.9},
                     {"16B", 48, 6144, 32, 4, 1, 192, 192, 489.1},
                     {"32B", 56, 7168, 48, 8, 1, 384, 192, 459.6},
                     {"70B", 64, 8192, 84, 8, 2, 768, 384, 419.7},
                     {"119B", 80, 10240, 92, 8, 4, 1536, 768, 420.5},
                     {"177B", 96, 12288, 96, 8, 6, 2304, 1152, 432.8},
                     {"314B", 128, 16384, 96, 8, 8, 3072, 1536, 474.4},
                     {"462B", 144, 18432, 112, 8, 16, 6144, 3072, 459.9}};
  for (const Mg& r : h100) {
    rows.push_back({r.name, megatron_gpt(r.layers, r.hidden, r.heads, 131072, 4096), "h100-80gb",
                    r.gpus, r.tp * r.pp > 1 ? PlanStrategy::kTpPp : PlanStrategy::kZero1, r.tp,
                    r.pp, 4096, 1, r.batch, Ac::kNone, true, 1, true,
                    megatron_tokens(r.tflops, r.layers, r.hidden, 131072, 4096, false), 0});
  }
  // Narayanan et al. 2021, Table 1 (A100 80 GB, fp16, seq 2048, vocabulary 51200, full
  // recomputation; micro-batches and interleaving from the paper's scripts, sc21/run_table_1.sh).
  // Its FLOP/s count the recomputed forward.
  struct Mg21 {
    const char* name;
    int64_t heads, hidden, layers;
    int tp, pp, gpus;
    int64_t batch, micro;
    int virtual_stages;
    double tflops;
  };
  const Mg21 a100[] = {{"1.7B", 24, 2304, 24, 1, 1, 32, 512, 16, 1, 137},
                       {"3.6B", 32, 3072, 30, 2, 1, 64, 512, 16, 1, 138},
                       {"7.5B", 32, 4096, 36, 4, 1, 128, 512, 16, 1, 142},
                       {"18.4B", 48, 6144, 40, 8, 1, 256, 1024, 8, 1, 135},
                       {"39.1B", 64, 8192, 48, 8, 2, 512, 1536, 4, 1, 138},
                       {"76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 2, 3, 140},
                       {"145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 2, 2, 148},
                       {"310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 1, 2, 155},
                       {"529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 1, 3, 163},
                       {"1008B", 160, 25600, 128, 8, 64, 3072, 3072, 1, 1, 163}};
  for (const Mg21& r : a100) {
    rows.push_back({r.name, megatron_gpt(r.layers, r.hidden, r.heads, 51200, 2048), "a100-80gb",
                    r.gpus, r.tp * r.pp > 1 ? PlanStrategy::kTpPp : PlanStrategy::kDdp, r.tp, r.pp,
                    2048, r.micro, r.batch, Ac::kFull, false, r.virtual_stages, false,
                    megatron_tokens(r.tflops, r.layers, r.hidden, 51200, 2048, true), 0});
  }
  // torchtitan, Llama 3.1 on H100 (benchmarks/llama3_h100_202412_torchtitan.md and
  // asyncTP_llama3_h100_2025-06_torchtitan.md: H100 96 GB HBM2e at 500 W; seq 8192; FSDP2 with
  // bf16 parameters and fp32 reduction), and Llama 3 on 64 A100 80 GB (docs/performance.md of
  // 2024-08). Eager rows, bf16 rows only (float8 linear layers are not modelled).
  const PlanModel l8 = PlanModel::from_config(model_preset("llama3.1-8b"));
  const PlanModel l70 = PlanModel::from_config(model_preset("llama3-70b"));
  const PlanModel l405 = PlanModel::from_config(model_preset("llama3-405b"));
  const auto fsdp = PlanStrategy::kFullShard;
  rows.push_back({"tt 8B FSDP8", l8, "h100-80gb", 8, fsdp, 1, 1, 8192, 2, 16, Ac::kSelective, true,
                  1, false, 5762, 82.4});
  rows.push_back({"tt 8B FSDP8 compile", l8, "h100-80gb", 8, fsdp, 1, 1, 8192, 2, 16,
                  Ac::kSelective, true, 1, false, 6667, 77.0});
  rows.push_back({"tt 8B FSDP128", l8, "h100-80gb", 128, fsdp, 1, 1, 8192, 2, 256, Ac::kSelective,
                  true, 1, false, 5605, 67.0});
  rows.push_back({"tt 8B FSDP128 compile", l8, "h100-80gb", 128, fsdp, 1, 1, 8192, 2, 256,
                  Ac::kSelective, true, 1, false, 6514, 62.0});
  rows.push_back({"tt 8B FSDP8xTP8", l8, "h100-80gb", 64, fsdp, 8, 1, 8192, 12, 96, Ac::kSelective,
                  true, 1, false, 4378, 0});
  rows.push_back({"tt 70B FSDP32xTP8", l70, "h100-80gb", 256, fsdp, 8, 1, 8192, 16, 512, Ac::kFull,
                  true, 1, false, 597.3, 0});
  rows.push_back({"tt 405B FSDP16xTP8", l405, "h100-80gb", 128, fsdp, 8, 1, 8192, 2, 32, Ac::kFull,
                  true, 1, false, 109, 0,
                  "eager bf16 on H100 95 GB HBM2e at a lower power limit, whose peak torchtitan "
                  "puts between the SXM's 989 and the NVL's 835 TFLOP/s"});
  rows.push_back({"tt A100 8B FSDP64", l8, "a100-80gb", 64, fsdp, 1, 1, 8192, 1, 64, Ac::kSelective,
                  true, 1, false, 2973, 0});
  rows.push_back({"tt A100 70B FSDP64", l70, "a100-80gb", 64, fsdp, 1, 1, 8192, 1, 64, Ac::kFull,
                  true, 1, false, 331, 0});
  return rows;
}

Candidate evaluate(const PublishedRun& r, double efficiency) {
  ClusterOptions cluster;
  cluster.gpu(r.gpu).gpus_per_node(std::min(8, r.gpus)).nodes(std::max(1, r.gpus / 8));
  WorkloadOptions w;
  w.seq_len(r.seq_len)
      .micro_batch(r.micro_batch)
      .global_batch(r.global_batch)
      .fp32_grads(r.fp32_grads)
      .activation_checkpointing(r.ac == Ac::kFull)
      .selective_checkpointing(r.ac == Ac::kSelective)
      .virtual_stages(r.virtual_stages)
      .tp_overlap(r.tp_overlap)
      .efficiency(efficiency);
  Candidate c;
  c.strategy = r.strategy;
  c.tp = r.tp;
  c.pp = r.pp;
  return evaluate_candidate(c, r.model, hardware_spec(r.gpu), cluster, w);
}

// The least-squares fit, in log throughput, of a + b log2(d_model / 4096) over one device
// kind's rows, on a grid of 0.005 and 0.0025.
std::pair<double, double> fit(const std::string& gpu) {
  double best = 1e9, best_a = 0, best_b = 0;
  for (int i = 0; i <= 80; ++i) {
    for (int j = 0; j <= 40; ++j) {
      const double a = 0.30 + 0.005 * i, b = 0.0025 * j;
      double squares = 0;
      for (const PublishedRun& r : published_runs()) {
        if (r.gpu != gpu) continue;
        const double e = std::clamp(a + b * std::log2(r.model.d_model / 4096.0), 0.2, 0.8);
        const double err = std::log(evaluate(r, e).tokens_per_s / r.gpus / r.tokens_per_s_per_gpu);
        squares += err * err;
      }
      if (squares < best) best = squares, best_a = a, best_b = b;
    }
  }
  return {best_a, best_b};
}

TEST(PublishedRuns, TheEfficiencyIsTheFitOfThePublishedRuns) {
  for (const char* gpu : {"h100-80gb", "a100-80gb"}) {
    const auto [a, b] = fit(gpu);
    const HardwareSpec& hw = hardware_spec(gpu);
    EXPECT_NEAR(hw.default_efficiency, a, 1e-9) << gpu;
    EXPECT_NEAR(hw.efficiency_per_doubling, b, 1e-9) << gpu;
  }
}

std::string one_decimal(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.1f", v);
  return buffer;
}

std::string percent(double fraction) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%+.0f%%", 100 * fraction);
  return buffer;
}

TEST(PublishedRuns, EachRowIsWithinTheBoundsOrSaysWhyNot) {
  // Throughput within 20%, memory within 15%; the table docs/planner.md prints.
  std::printf(
      "| run | GPUs | layout | tokens/s/GPU published | planner | error | peak GiB "
      "published | planner | error |\n");
  for (const PublishedRun& r : published_runs()) {
    const Candidate c = evaluate(r, 0);
    ASSERT_TRUE(c.valid) << r.name << ": " << c.note;
    const double tps = c.tokens_per_s / r.gpus;
    const double err = tps / r.tokens_per_s_per_gpu - 1;
    const double mem = c.memory.total() / kGiB;
    const double mem_err = r.memory_gib > 0 ? mem / r.memory_gib - 1 : 0;
    const bool within = std::abs(err) <= 0.20 && std::abs(mem_err) <= 0.15;
    std::printf("| %s | %d | %s | %.0f | %.0f | %s | %s | %.1f | %s |\n", r.name, r.gpus,
                c.label().c_str(), r.tokens_per_s_per_gpu, tps, percent(err).c_str(),
                r.memory_gib > 0 ? one_decimal(r.memory_gib).c_str() : "", mem,
                r.memory_gib > 0 ? percent(mem_err).c_str() : "");
    if (*r.why_not) {
      EXPECT_FALSE(within) << r.name << " is within the bounds now: drop its reason";
    } else {
      EXPECT_LE(std::abs(err), 0.20) << r.name;
      EXPECT_LE(std::abs(mem_err), 0.15) << r.name;
    }
  }
}

}  // namespace published_runs_test
}  // namespace shardtrain
