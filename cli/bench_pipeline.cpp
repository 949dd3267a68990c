#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>

#include "commands.h"
#include "shardtrain/pipeline.h"

namespace shardtrain::cli {

void add_bench_pipeline_command(CLI::App& bench) {
  auto* pipeline = bench.add_subcommand(
      "pipeline",
      "Print a pipeline schedule: each rank's order of forwards (F), backwards (B) and, for "
      "zero_bubble, input (I) and weight (W) gradients, as MICRO_BATCH.sSTAGE, and its bubble "
      "when run with unit costs (forward 1, I and W 1 each, B 2) against the formula");
  struct Options {
    int pp = 4, virtual_stages = 1, micro_batches = 8;
    std::string schedule = "1f1b";
  };
  auto options = std::make_shared<Options>();
  pipeline->add_option("--pp", options->pp, "Pipeline ranks")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  pipeline->add_option("--microbatches", options->micro_batches, "Micro-batches per step")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  pipeline
      ->add_option("--virtual-stages", options->virtual_stages,
                   "Stages per rank (interleaved_1f1b)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  pipeline
      ->add_option("--schedule", options->schedule, "gpipe, 1f1b, interleaved_1f1b or zero_bubble")
      ->capture_default_str();
  pipeline->callback([options] {
    PipelineScheduleKind kind;
    try {
      kind = pipeline_schedule_from_string(options->schedule);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string("--schedule ") + e.what());
    }
    const PipelineSchedule schedule =
        make_pipeline_schedule(kind, options->pp, options->virtual_stages, options->micro_batches,
                               {"--schedule", "--pp", "--virtual-stages", "--microbatches", " "});
    for (int r = 0; r < schedule.ranks; ++r) {
      std::cout << "rank " << r << ":";
      for (const auto& action : schedule.actions[static_cast<size_t>(r)]) {
        std::cout << " " << to_string(action);
      }
      std::cout << "\n";
    }
    std::printf("bubble with unit costs %.4f, formula %.4f\n", schedule.simulated_bubble,
                pipeline_bubble_formula(kind, options->pp, options->virtual_stages,
                                        options->micro_batches));
  });
}

}  // namespace shardtrain::cli
