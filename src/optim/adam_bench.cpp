// `shardtrain bench adam`: the fused AdamW against LibTorch's and against the memory bandwidth
// measured in the same run, plus the NVMe-swapped variant.

#include <ATen/Parallel.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <sstream>
#include <stdexcept>

#include "shardtrain/fused_adamw.h"
#include "shardtrain/threads.h"
#include "train/memory_check.h"

namespace shardtrain {
namespace {

// Bytes an in-place AdamW update must move per fp32 element: read param, grad, exp_avg and
// exp_avg_sq, write param, exp_avg and exp_avg_sq.
constexpr double kBytesPerElement = 28;

// One untimed call, then the median of `repeats` timed ones, in seconds.
double median_seconds(int repeats, const std::function<void()>& run) {
  run();
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  const size_t mid = times.size() / 2;
  return times.size() % 2 ? times[mid] : 0.5 * (times[mid - 1] + times[mid]);
}

}  // namespace

std::vector<AdamBenchRow> bench_adam(const AdamBenchOptions& options) {
  if (options.params_ <= 0) {
    throw std::invalid_argument("bench adam: --params must be > 0, got " +
                                std::to_string(options.params_));
  }
  if (options.repeats_ < 1) {
    throw std::invalid_argument("bench adam: --repeats must be >= 1, got " +
                                std::to_string(options.repeats_));
  }
  if (options.threads_ < 0) {
    throw std::invalid_argument("bench adam: --threads must be >= 0, got " +
                                std::to_string(options.threads_));
  }
  // Refused before anything is allocated: the parameters, their gradients, AdamW's two moments
  // (fp32) and a bf16 copy, 18 bytes per element, and a temporary as large as one of them.
  detail::require_host_memory(22.0 * static_cast<double>(options.params_),
                              "bench adam: --params " + std::to_string(options.params_),
                              "22 bytes per parameter");
  if (options.threads_ > 0) set_num_threads(options.threads_);
  const int64_t n = options.params_;
  std::vector<AdamBenchRow> rows;
  auto add = [&](const std::string& name, double seconds) {
    AdamBenchRow row;
    row.name = name;
    row.median_s = seconds;
    row.elements_per_s = static_cast<double>(n) / seconds;
    row.gbps_28 = row.elements_per_s * kBytesPerElement / 1e9;
    rows.push_back(row);
  };

  // The bound: copying one params-sized fp32 buffer into another, counted as STREAM does (4
  // bytes read + 4 written per element), two ways: ATen's copy_ and glibc's memcpy (which
  // streams large copies past the cache) on the same threads. The faster one sets the bound.
  double copy_gbps = 0;
  {
    auto src = at::rand({n}), dst = at::empty({n});
    const float* from = src.data_ptr<float>();
    float* to = dst.data_ptr<float>();
    const std::pair<const char*, std::function<void()>> copies[] = {
        {"copy (at::copy_)", [&] { dst.copy_(src); }},
        {"copy (memcpy)", [&] {
           at::parallel_for(0, n, int64_t{1} << 16, [&](int64_t begin, int64_t end) {
             std::memcpy(to + begin, from + begin, (end - begin) * sizeof(float));
           });
         }}};
    for (const auto& [name, run] : copies) {
      const double t = median_seconds(options.repeats_, run);
      AdamBenchRow row;
      row.name = name;
      row.median_s = t;
      row.elements_per_s = static_cast<double>(n) / t;
      row.gbps_28 = 8.0 * row.elements_per_s / 1e9;
      copy_gbps = std::max(copy_gbps, row.gbps_28);
      rows.push_back(row);
    }
  }

  auto param = (at::randn({n}) * 0.02).requires_grad_(true);
  param.mutable_grad() = at::randn({n}) * 1e-3;
  const auto defaults = torch::optim::AdamWOptions(1e-4).weight_decay(0.01);
  double torch_s = 0;
  at::Tensor exp_avg, exp_avg_sq;
  {
    torch::optim::AdamW reference({param}, defaults);
    torch_s = median_seconds(options.repeats_, [&] { reference.step(); });
    auto& state = static_cast<torch::optim::AdamWParamState&>(*reference.state().begin()->second);
    exp_avg = state.exp_avg();
    exp_avg_sq = state.exp_avg_sq();
    add("torch::optim::AdamW", torch_s);
  }
  // The fused variants continue from LibTorch's state, so they run on realistic values.
  at::Tensor p = param.detach();
  const at::Tensor g = param.grad();
  int64_t step = options.repeats_ + 1;
  auto hyper = [&] { return AdamWStep::from(defaults, ++step); };
  const double fused_s = median_seconds(
      options.repeats_, [&] { fused_adamw_step(p, g, exp_avg, exp_avg_sq, hyper()); });
  add("fused AdamW", fused_s);
  {
    auto bf16 = at::empty({n}, at::kBFloat16);
    add("fused AdamW + bf16 copy", median_seconds(options.repeats_, [&] {
          fused_adamw_step(p, g, exp_avg, exp_avg_sq, hyper(), &bf16);
        }));
  }
  exp_avg = at::Tensor();
  exp_avg_sq = at::Tensor();

  if (!options.nvme_dir_.empty()) {
    for (const bool direct : {false, true}) {
      std::unique_ptr<NvmeAdamW> swapped;
      try {
        swapped = std::make_unique<NvmeAdamW>(n, NvmeAdamWOptions()
                                                     .dir(options.nvme_dir_)
                                                     .chunk_elements(options.nvme_chunk_elements_)
                                                     .direct_io(direct));
      } catch (const std::invalid_argument& e) {
        // Only O_DIRECT may be missing where buffered files work; anything else is bad input.
        if (!direct) throw;
        std::fprintf(stderr, "bench adam: skipping O_DIRECT: %s\n", e.what());
        continue;
      }
      int64_t nvme_step = 0;
      add(direct ? "NVMe-swapped (O_DIRECT)" : "NVMe-swapped (page cache)",
          median_seconds(options.repeats_,
                         [&] { swapped->step(p, g, AdamWStep::from(defaults, ++nvme_step)); }));
    }
  }
  const double bound_elements = copy_gbps * 1e9 / kBytesPerElement;
  for (auto& row : rows) {
    if (row.name.rfind("copy", 0) == 0) continue;
    row.vs_torch = torch_s / row.median_s;
    row.of_bound = row.elements_per_s / bound_elements;
  }
  return rows;
}

std::string format_adam_bench_table(const std::vector<AdamBenchRow>& rows) {
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof(line), "%-28s %12s %14s %10s %10s %10s\n", "variant", "median_ms",
                "Melem/s", "GB/s", "vs_torch", "of_bound");
  out << line;
  double fused_s = 0;
  for (const auto& row : rows) {
    if (row.name == "fused AdamW") fused_s = row.median_s;
    char ratio[32] = "-", bound[32] = "-";
    if (row.name.rfind("copy", 0) != 0) {
      std::snprintf(ratio, sizeof(ratio), "%.2fx", row.vs_torch);
      std::snprintf(bound, sizeof(bound), "%.1f%%", row.of_bound * 100);
    }
    std::snprintf(line, sizeof(line), "%-28s %12.3f %14.1f %10.2f %10s %10s\n", row.name.c_str(),
                  row.median_s * 1e3, row.elements_per_s / 1e6, row.gbps_28, ratio, bound);
    out << line;
  }
  for (const auto& row : rows) {
    if (row.name.rfind("NVMe", 0) == 0 && fused_s > 0) {
      std::snprintf(line, sizeof(line), "%s step time / in-memory fused step time: %.2fx\n",
                    row.name.c_str(), row.median_s / fused_s);
      out << line;
    }
  }
  return out.str();
}

}  // namespace shardtrain
