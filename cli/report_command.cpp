// shardtrain report RUN_DIR: one self-contained HTML page of a run (docs/report.md). The report
// itself is LibTorch-free; this command adds the peak FLOP/s MFU needs: a known accelerator's
// (--device), a given one (--peak-tflops), or this host's measured now.
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "commands.h"
#include "shardtrain/plan.h"
#include "shardtrain/report.h"
#include "shardtrain/threads.h"

namespace shardtrain::cli {
namespace {

struct ReportArgs {
  std::string run_dir;
  std::string out;
  double peak_tflops = 0;
  std::string device;
};

// The datasheet peak of `name` (an entry of the planner's hardware table, or the start of one:
// "h100" is h100-80gb) in the dtype the run's matrix multiplies used. fp16 runs use the bf16
// figure: tensor cores run both at one rate on every device listed.
ReportOptions device_peak(const std::string& name, const std::string& dtype) {
  const HardwareSpec* found = nullptr;
  std::string known;
  for (const auto& spec : hardware_table()) {
    if (spec.name == "cpu") continue;  // one core of one machine: measure the host instead
    known += (known.empty() ? "" : ", ") + spec.name;
    if (spec.name == name) {
      found = &spec;
      break;
    }
    // A prefix names a device when every entry it matches has the same peaks (a100-40gb and
    // a100-80gb differ only in memory).
    if (spec.name.rfind(name + "-", 0) == 0) {
      if (found && (found->peak_bf16_flops != spec.peak_bf16_flops ||
                    found->peak_fp32_flops != spec.peak_fp32_flops)) {
        throw std::invalid_argument("--device '" + name + "' matches both " + found->name +
                                    " and " + spec.name);
      }
      if (!found) found = &spec;
    }
  }
  if (!found) {
    throw std::invalid_argument("--device '" + name + "' is not a known device (known: " + known +
                                "; for a CPU run leave --device out: the host is measured)");
  }
  const bool half = dtype == "bf16" || dtype == "fp16";
  const double flops = half ? found->peak_bf16_flops : found->peak_fp32_flops;
  return ReportOptions().peak_flops_per_rank(
      flops, found->name + " " + (half ? "bf16 dense" : "fp32 (not TF32)") +
                 " peak per device, from the vendor's datasheet (--device " + name + ")");
}

// This host's matrix-multiply rate with every core: the best of repeated 1024×1024 at::mm in
// the run's compute dtype (fp32 unless the run used bf16), about half a second in all.
ReportOptions measured_host_peak(const std::string& dtype) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const at::ScalarType type = dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  const int saved = at::get_num_threads();
  set_num_threads(cores);
  constexpr int64_t n = 1024;
  const at::Tensor a = at::randn({n, n}).to(type);
  const at::Tensor b = at::randn({n, n}).to(type);
  at::Tensor c = at::mm(a, b);  // warm-up: packing buffers, the thread pool
  double best = 1e30;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    c = at::mm(a, b);
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
    if (i >= 4 && std::chrono::duration<double>(t1 - start).count() > 0.5) break;
  }
  set_num_threads(saved);
  const double flops = 2.0 * n * n * n / best;
  return ReportOptions().peak_flops_shared(
      flops, "measured now on this host: " + std::string(dtype == "bf16" ? "bf16" : "fp32") +
                 " at::mm of 1024×1024 on " + std::to_string(cores) +
                 " threads, best of several; assumes the run's ranks shared this host");
}

void run_report(const ReportArgs& a) {
  // Bad input is reported before anything is measured.
  const RunInfo info = describe_run(a.run_dir);
  // Damaged input the page works around is said here too, not only on the page.
  for (const std::string& note : info.skipped) {
    std::fprintf(stderr, "shardtrain report: warning: %s\n", note.c_str());
  }
  ReportOptions options;
  if (a.peak_tflops > 0) {
    options.peak_flops_per_rank(a.peak_tflops * 1e12, "given with --peak-tflops, per rank");
  } else if (!a.device.empty()) {
    options = device_peak(a.device, info.compute_dtype);
  } else if (info.needs_peak()) {
    options = measured_host_peak(info.compute_dtype);
  }
  const std::string out =
      a.out.empty() ? (std::filesystem::path(a.run_dir) / "report.html").string() : a.out;
  write_report(a.run_dir, out, options);
  std::printf("wrote %s\n", out.c_str());
}

}  // namespace

void add_report_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "report",
      "Write one self-contained HTML page of a run: loss, learning rate, throughput and MFU, "
      "memory, communication, settings, traces, scaling (docs/report.md)");
  // Every value an option writes into lives in `a`, which the callback owns (see ckpt_command).
  auto a = std::make_shared<ReportArgs>();
  cmd->add_option("RUN_DIR", a->run_dir, "the run directory (run.json, metrics.jsonl, ...)")
      ->required();
  cmd->add_option("--out,-o", a->out, "the HTML file to write (default: RUN_DIR/report.html)");
  auto* peak = cmd->add_option("--peak-tflops", a->peak_tflops,
                               "peak TFLOP/s of one rank's device, for MFU");
  peak->check(CLI::Range(1e-6, 1e9));
  auto* device = cmd->add_option(
      "--device", a->device,
      "the run's accelerator, for MFU from its datasheet peak in the run's dtype: h100, h200, "
      "a100, rtx-4090 (default: measure this host's CPU)");
  peak->excludes(device);
  cmd->callback([a] { run_report(*a); });
}

}  // namespace shardtrain::cli
