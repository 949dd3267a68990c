#include <ATen/Parallel.h>

#include <iostream>
#include <map>

#include "commands.h"
#include "shardtrain/fused_adamw.h"

namespace shardtrain::cli {

void add_bench_adam_command(CLI::App& bench) {
  auto* adam = bench.add_subcommand(
      "adam",
      "Time one AdamW step over a flat fp32 partition: LibTorch's AdamW, the fused AdamW (with "
      "and without a bf16 copy) and NVMe-swapped state, against a copy bandwidth measured in the "
      "same run (28 bytes per element is the bound)");
  auto options = std::make_shared<AdamBenchOptions>();
  adam->add_option("--params", options->params_,
                   "Parameters updated per step (K, M, G suffixes are powers of 1000)")
      ->capture_default_str()
      ->transform(CLI::AsNumberWithUnit(
          std::map<std::string, int64_t>{{"k", 1000}, {"m", 1000000}, {"g", 1000000000}},
          CLI::AsNumberWithUnit::CASE_INSENSITIVE));
  adam->add_option("--threads", options->threads_, "Intra-op threads (0: LibTorch's default)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1024));
  adam->add_option("--repeats", options->repeats_, "Timed steps per variant (median reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  adam->add_option("--nvme-dir", options->nvme_dir_,
                   "Directory for the NVMe-swapped state files (\"\" skips those rows)")
      ->capture_default_str();
  adam->add_option("--nvme-chunk", options->nvme_chunk_elements_,
                   "Elements per NVMe read/update/write chunk")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  adam->callback([options] {
    const auto rows = bench_adam(*options);
    std::cout << "params " << options->params_ << ", threads " << at::get_num_threads() << ", isa "
              << fused_adamw_isa() << ", repeats " << options->repeats_ << "\n"
              << format_adam_bench_table(rows) << std::flush;
  });
}

}  // namespace shardtrain::cli
