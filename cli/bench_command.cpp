#include <iostream>

#include "commands.h"
#include "shardtrain/bench.h"
#include "shardtrain/rendezvous.h"

namespace shardtrain::cli {

void add_bench_command(CLI::App& app, int& exit_code) {
  auto* bench = app.add_subcommand("bench", "Benchmarks, in the units people already use");
  bench->require_subcommand(1);
  add_bench_adam_command(*bench);
  auto* coll = bench->add_subcommand(
      "collectives",
      "Time collectives over a size sweep and print nccl-tests' columns (size, time, algbw, "
      "busbw). Run it under a launcher: shardtrain launch --nproc 4 -- shardtrain bench "
      "collectives");
  auto options = std::make_shared<CollectiveBenchOptions>();
  auto op = std::make_shared<std::string>("all_reduce");
  auto dtype = std::make_shared<std::string>("float32");
  auto timeout_s = std::make_shared<double>(300.0);
  coll->add_option("--op", *op,
                   "all_reduce, all_gather, reduce_scatter, broadcast, or all (each in turn)")
      ->capture_default_str()
      ->check(CLI::IsMember({"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all"}));
  coll->add_option("--min-bytes,-b", options->min_bytes_,
                   "Smallest array (bytes; K, M, G suffixes are powers of 1024)")
      ->capture_default_str()
      ->transform(CLI::AsSizeValue(false));
  coll->add_option("--max-bytes,-e", options->max_bytes_, "Largest array (bytes)")
      ->capture_default_str()
      ->transform(CLI::AsSizeValue(false));
  coll->add_option("--step-factor,-f", options->step_factor_, "Size multiplier between rows")
      ->capture_default_str()
      ->check(CLI::Range(2, 1024));
  coll->add_option("--iters,-n", options->iters_, "Timed iterations per size")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  coll->add_option("--warmup,-w", options->warmup_, "Untimed iterations per size")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  coll->add_option("--dtype", *dtype, "float32, bfloat16, float16 or float64")
      ->capture_default_str()
      ->check(CLI::IsMember({"float32", "bfloat16", "float16", "float64"}));
  coll->add_option("--timeout", *timeout_s, "Seconds before a collective or the rendezvous fails")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  auto no_check = std::make_shared<bool>(false);
  coll->add_flag("--no-check", *no_check, "Skip verifying the results of each size");
  coll->callback([=, &exit_code] {
    if (*op == "all") {
      options->ops({"all_reduce", "all_gather", "reduce_scatter", "broadcast"});
    } else {
      options->ops({*op});
    }
    const std::map<std::string, at::ScalarType> dtypes = {{"float32", at::kFloat},
                                                          {"bfloat16", at::kBFloat16},
                                                          {"float16", at::kHalf},
                                                          {"float64", at::kDouble}};
    options->dtype(dtypes.at(*dtype)).check(!*no_check);
    auto group = init_from_environment(ProcessGroupOptions().timeout(
        std::chrono::milliseconds(static_cast<int64_t>(*timeout_s * 1000))));
    const auto rows = bench_collectives(*group, *options);
    bool ok = true;
    for (const auto& row : rows) ok = ok && row.values_ok;
    if (group->rank() == 0) {
      std::cout << format_bench_table(rows, group->size()) << std::flush;
    }
    if (!ok) {
      std::cerr << "shardtrain bench collectives: some results were wrong (see 'check')\n";
      exit_code = 1;
    }
  });
}

}  // namespace shardtrain::cli
