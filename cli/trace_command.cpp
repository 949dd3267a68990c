#include <filesystem>
#include <iostream>

#include "commands.h"
#include "shardtrain/trace.h"

namespace shardtrain::cli {

void add_trace_command(CLI::App& app) {
  auto* trace = app.add_subcommand("trace", "Timeline traces recorded with run.trace = true");
  trace->require_subcommand(1);
  auto* merge = trace->add_subcommand(
      "merge",
      "Merge every rank's RUN_DIR/trace/rank_N.json into one file that Perfetto's UI "
      "(ui.perfetto.dev, 'Open trace file') or chrome://tracing opens as is");
  struct MergeArgs {
    std::string run_dir;
    std::string out;
  };
  auto a = std::make_shared<MergeArgs>();
  merge->add_option("run_dir", a->run_dir, "The run directory (run.dir)")->required();
  merge->add_option("--out,-o", a->out, "The merged trace (default: RUN_DIR/trace.json)");
  merge->callback([a] {
    const std::string out =
        a->out.empty() ? (std::filesystem::path(a->run_dir) / "trace.json").string() : a->out;
    const int ranks = merge_traces(a->run_dir, out);
    std::cout << "merged the traces of " << ranks << " rank(s) into " << out << "\n";
  });
}

}  // namespace shardtrain::cli
