// The hardware the planner knows: accelerators from their vendors' datasheets, the CPU host
// from a measurement (bench/results/planner.md), and the links between them.
#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <thread>

#include "shardtrain/plan.h"
#include "shardtrain/threads.h"

namespace shardtrain {
namespace {

constexpr double kGB = 1e9;
constexpr double kTera = 1e12;

// The efficiency fits (see hardware_table()): at d_model 4096, and per doubling of d_model.
constexpr double kA100Efficiency = 0.525, kA100EfficiencyPerDoubling = 0.04;
constexpr double kH100Efficiency = 0.45, kH100EfficiencyPerDoubling = 0.065;

HardwareSpec gpu(std::string name, double memory_gb, double bf16_tflops, double fp32_tflops,
                 double bandwidth_gbs, double host_gb, std::string intra, std::string source) {
  HardwareSpec s;
  s.name = std::move(name);
  s.memory_bytes = memory_gb * kGB;
  s.peak_bf16_flops = bf16_tflops * kTera;
  s.peak_fp32_flops = fp32_tflops * kTera;
  s.memory_bw = bandwidth_gbs * kGB;
  s.host_memory_bytes = host_gb * kGB;
  s.default_intra = std::move(intra);
  s.default_efficiency = 0.4;
  s.source = std::move(source);
  return s;
}

// One core of the machine bench/results/planner.md describes (2-core AMD EPYC VM, 24 GiB),
// measured with `shardtrain plan --measure-host --threads 1`. A host of another kind should be
// measured the same way and given with ClusterOptions::hardware().
HardwareSpec cpu_core() {
  HardwareSpec s;
  s.name = "cpu";
  s.memory_bytes = 12.0 * kGB;  // 24 GiB / 2 cores, rounded down
  s.peak_fp32_flops = 49e9;     // 1024^3 GEMM, one thread (AVX-512)
  s.peak_bf16_flops = 115e9;    // the same in bf16 (AVX-512 BF16)
  s.memory_bw = 9e9;            // copy of 256 MiB, read + written bytes
  s.host_memory_bytes = 24.0 * kGB;
  s.default_intra = "loopback";
  s.default_efficiency = 1.0;  // the figures are already achieved GEMM rates
  s.source = "measured: bench/results/planner.md (shardtrain plan --measure-host)";
  return s;
}

}  // namespace

double modelled_efficiency(const HardwareSpec& hw, int64_t d_model) {
  if (hw.efficiency_per_doubling == 0 || d_model <= 0) return hw.default_efficiency;
  const double e = hw.default_efficiency +
                   hw.efficiency_per_doubling * std::log2(static_cast<double>(d_model) / 4096.0);
  return std::clamp(e, 0.2, 0.8);
}

const std::vector<HardwareSpec>& hardware_table() {
  // Dense tensor-core bf16 (no sparsity), plain fp32 (not TF32), HBM/GDDR bandwidth and memory
  // from the vendors' datasheets; host memory is that of the vendor's reference server.
  // Efficiency: the least-squares fit of the published runs of docs/planner.md ("Published
  // runs", PublishedRuns.TheEfficiencyIsTheFitOfThePublishedRuns): A100 to Narayanan et al.
  // 2021's table and torchtitan's A100 rows, H100 (and H200, the same chip) to Megatron-LM's
  // H100 table and torchtitan's H100 rows. The RTX 4090 has no published runs: 0.4.
  auto fitted = [](HardwareSpec s, double at_4096, double per_doubling) {
    s.default_efficiency = at_4096;
    s.efficiency_per_doubling = per_doubling;
    return s;
  };
  static const std::vector<HardwareSpec> table = {
      fitted(gpu("a100-40gb", 40, 312, 19.5, 1555, 1000, "nvlink",
                 "NVIDIA A100 Tensor Core GPU datasheet (SXM4 40GB); host: DGX A100 (1 TB)"),
             kA100Efficiency, kA100EfficiencyPerDoubling),
      fitted(gpu("a100-80gb", 80, 312, 19.5, 2039, 2000, "nvlink",
                 "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB); host: DGX A100 640GB (2 TB)"),
             kA100Efficiency, kA100EfficiencyPerDoubling),
      fitted(gpu("h100-80gb", 80, 989, 67, 3350, 2000, "nvlink",
                 "NVIDIA H100 Tensor Core GPU datasheet (SXM5; 1979 TFLOPS bf16 with sparsity); "
                 "host: DGX H100 (2 TB)"),
             kH100Efficiency, kH100EfficiencyPerDoubling),
      fitted(gpu("h200-141gb", 141, 989, 67, 4800, 2000, "nvlink",
                 "NVIDIA H200 Tensor Core GPU datasheet (SXM; 1979 TFLOPS bf16 with sparsity); "
                 "host: DGX H200 (2 TB)"),
             kH100Efficiency, kH100EfficiencyPerDoubling),
      gpu("rtx-4090", 24, 165.2, 82.6, 1008, 128, "pcie4",
          "NVIDIA Ada Lovelace architecture whitepaper (GeForce RTX 4090: bf16 with fp32 "
          "accumulate, dense); host: a 128 GB workstation"),
      cpu_core(),
  };
  return table;
}

const HardwareSpec& hardware_spec(const std::string& kind) {
  for (const auto& s : hardware_table()) {
    if (s.name == kind) return s;
  }
  std::string valid;
  for (const auto& s : hardware_table()) valid += (valid.empty() ? "" : ", ") + s.name;
  throw std::invalid_argument("unknown hardware kind '" + kind + "' (known: " + valid + ")");
}

LinkSpec link_spec(const std::string& name, const std::string& gpu) {
  // Bandwidth per direction. NVLink: 600 GB/s (A100, NVLink 3) and 900 GB/s (H100/H200,
  // NVLink 4) are both directions together. PCIe x16: 8, 16, 32 GT/s per lane, 128b/130b.
  if (name == "nvlink") {
    if (gpu == "rtx-4090" || gpu == "cpu") {
      throw std::invalid_argument("intra-node link 'nvlink': " + gpu + " has no NVLink");
    }
    const bool nvlink3 = gpu.rfind("a100", 0) == 0;
    return {"nvlink", (nvlink3 ? 300.0 : 450.0) * kGB, 3e-6};
  }
  if (name == "pcie3") return {"pcie3", 15.75 * kGB, 5e-6};
  if (name == "pcie4") return {"pcie4", 31.5 * kGB, 5e-6};
  if (name == "pcie5") return {"pcie5", 63.0 * kGB, 5e-6};
  // Gloo over local TCP between two processes on this 2-core host: a fit of `shardtrain bench
  // collectives` all_reduce times from 1 to 16 MiB (bench/results/planner.md).
  if (name == "loopback") return {"loopback", 1.2 * kGB, 2e-3};
  if (name == "ib") return {"ib", 50.0 * kGB, 5e-6};               // 400 Gb/s NDR, per NIC
  if (name == "ethernet") return {"ethernet", 12.5 * kGB, 30e-6};  // 100 GbE, per node
  throw std::invalid_argument("unknown link '" + name +
                              "' (known: nvlink, pcie3, pcie4, pcie5, loopback, ib, ethernet)");
}

namespace {

// Best of `repeats` timings of `body`, seconds.
template <typename F>
double best_time(int repeats, F body) {
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    body();
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

double gemm_flops(at::ScalarType dtype, int64_t n) {
  const at::Tensor a = at::randn({n, n}).to(dtype);
  const at::Tensor b = at::randn({n, n}).to(dtype);
  at::Tensor c = at::mm(a, b);  // warm-up: packing buffers, thread pool
  const double t = best_time(5, [&] { c = at::mm(a, b); });
  return 2.0 * static_cast<double>(n) * n * n / t;
}

}  // namespace

HardwareSpec measure_cpu_host(int threads) {
  if (threads < 1) throw std::invalid_argument("measure_cpu_host: threads must be >= 1");
  const int saved = at::get_num_threads();
  set_num_threads(threads);  // LibTorch's and the BLAS's: the GEMM below runs in the BLAS
  HardwareSpec s = hardware_spec("cpu");
  s.peak_fp32_flops = gemm_flops(at::kFloat, 1024);
  s.peak_bf16_flops = gemm_flops(at::kBFloat16, 1024);
  // Copy of 256 MiB: every byte is read once and written once.
  const at::Tensor src = at::ones({64 << 20}, at::kFloat);
  at::Tensor dst = at::empty_like(src);
  dst.copy_(src);
  const double t = best_time(5, [&] { dst.copy_(src); });
  s.memory_bw = 2.0 * static_cast<double>(src.nbytes()) / t;
  set_num_threads(saved);
  const double pages = static_cast<double>(sysconf(_SC_PHYS_PAGES));
  const double page = static_cast<double>(sysconf(_SC_PAGE_SIZE));
  const double cores = std::max(1u, std::thread::hardware_concurrency());
  s.host_memory_bytes = pages * page;
  s.memory_bytes = s.host_memory_bytes / cores * threads;
  s.source = "measured on this host with " + std::to_string(threads) + " thread(s)";
  return s;
}

}  // namespace shardtrain
