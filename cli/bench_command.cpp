#include <iostream>

#include "commands.h"
#include "shardtrain/bench.h"
#include "shardtrain/rendezvous.h"

namespace shardtrain::cli {

void add_bench_command(CLI::App& app, int& exit_code) {
  auto* bench = app.add_subcommand("bench", "Benchmarks, in the units people already use");
  bench->require_subcommand(1);
  add_bench_adam_command(*bench);
  add_bench_scaling_command(*bench);
  add_bench_pipeline_command(*bench);
  auto* coll = bench->add_subcommand(
      "collectives",
      "Time collectives over a size sweep and print nccl-tests' columns (size, time, algbw, "
      "busbw). Run it under a launcher: shardtrain launch --nproc 4 -- shardtrain bench "
      "collectives");
  // Every value an option writes into lives in `a`, which the callback owns (see ckpt_command).
  struct CollectiveArgs {
    CollectiveBenchOptions options;
    std::string op = "all_reduce";
    std::string dtype = "float32";
    double timeout_s = 300.0;
    bool no_check = false;
  };
  auto a = std::make_shared<CollectiveArgs>();
  CollectiveBenchOptions* options = &a->options;
  coll->add_option("--op", a->op,
                   "all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, or all (each "
                   "in turn)")
      ->capture_default_str()
      ->check(CLI::IsMember(
          {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "all"}));
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
  coll->add_option("--dtype", a->dtype, "float32, bfloat16, float16 or float64")
      ->capture_default_str()
      ->check(CLI::IsMember({"float32", "bfloat16", "float16", "float64"}));
  coll->add_option("--timeout", a->timeout_s, "Seconds before a collective or the rendezvous fails")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  coll->add_flag("--no-check", a->no_check, "Skip verifying the results of each size");
  coll->callback([a, &exit_code] {
    CollectiveBenchOptions* options = &a->options;
    if (a->op == "all") {
      options->ops({"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"});
    } else {
      options->ops({a->op});
    }
    const std::map<std::string, at::ScalarType> dtypes = {{"float32", at::kFloat},
                                                          {"bfloat16", at::kBFloat16},
                                                          {"float16", at::kHalf},
                                                          {"float64", at::kDouble}};
    options->dtype(dtypes.at(a->dtype)).check(!a->no_check);
    auto group = init_from_environment(ProcessGroupOptions().timeout(
        std::chrono::milliseconds(static_cast<int64_t>(a->timeout_s * 1000))));
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
