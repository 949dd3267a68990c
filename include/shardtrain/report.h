// `shardtrain report`: one self-contained HTML page describing a run directory (loss, learning
// rate, throughput and MFU, memory per rank, communication, settings, trace time breakdown, and
// `bench scaling` results). The page needs no network: uPlot's script and stylesheet are built
// into the library and written inline. Nothing here uses LibTorch; docs/report.md describes
// what the page shows and how MFU is computed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shardtrain {

// The peak FLOP/s MFU is measured against. Two kinds: the peak of each rank's own device (an
// accelerator: the run's peak is that times world_size), or one peak all ranks shared (a CPU
// host whose cores the ranks divided among themselves: the run's peak is that figure alone).
// Without a peak the report shows throughput but no MFU.
class ReportOptions {
 public:
  ReportOptions& peak_flops_per_rank(double flops, std::string source) {
    peak_flops_ = flops;
    peak_shared_ = false;
    peak_source_ = std::move(source);
    return *this;
  }
  ReportOptions& peak_flops_shared(double flops, std::string source) {
    peak_flops_ = flops;
    peak_shared_ = true;
    peak_source_ = std::move(source);
    return *this;
  }
  double peak_flops() const { return peak_flops_; }
  bool peak_shared() const { return peak_shared_; }
  // How the peak was obtained, shown next to every MFU figure ("NVIDIA H100 datasheet, bf16
  // dense", "measured on this host: ...").
  const std::string& peak_source() const { return peak_source_; }

 private:
  double peak_flops_ = 0;  // FLOP/s; 0: no MFU
  bool peak_shared_ = false;
  std::string peak_source_;
};

// What a run directory holds, as far as choosing a peak needs to know.
struct RunInfo {
  int world_size = 0;          // 0 for a directory holding only scaling.json
  std::string compute_dtype;   // "bf16", "fp16" or "fp32": the dtype its matrix multiplies ran in
  int64_t steps_recorded = 0;  // distinct steps in metrics.jsonl
  // Model FLOPs per trained token (0 when run.json lacks the shapes): 6·N + 12·L·d·T, or
  // 4·N + 12·L·d·T for a LoRA run (docs/report.md).
  double flops_per_token = 0;
  bool needs_peak() const { return steps_recorded > 0 && flops_per_token > 0; }
  // What of metrics.jsonl the report skips and why (lines that are not JSON, that lack a step
  // and rank, an incomplete last line), as the page says it.
  std::vector<std::string> skipped;
};

// Reads and checks `run_dir` (run.json, metrics.jsonl, scaling.json) without rendering. Throws
// std::invalid_argument naming the directory and what is wrong: it does not exist, holds none
// of run.json, metrics.jsonl and scaling.json, or one of them is not valid (a missing key
// run.json must have, malformed JSON). A truncated or malformed line of metrics.jsonl is not an
// error: the report skips it and says so.
RunInfo describe_run(const std::string& run_dir);

// The whole HTML page for `run_dir`. Throws as describe_run does. The page's data (run.json,
// every kept metrics line, derived figures) is one JSON document in
// <script type="application/json" id="report-data">, which the page's own script draws from.
std::string render_report(const std::string& run_dir, const ReportOptions& options = {});

// Renders and writes the page to `out_path` atomically: a new temporary file beside it, renamed
// over `out_path`, so a reader never sees half a page and nothing but `out_path` is replaced.
// Throws std::invalid_argument when `out_path` is a directory or its folder does not exist,
// std::runtime_error when writing fails.
void write_report(const std::string& run_dir, const std::string& out_path,
                  const ReportOptions& options = {});

}  // namespace shardtrain
