// Timeline traces of training runs (run.trace = true): each rank writes RUN_DIR/trace/rank_N.json
// in Chrome's trace-event format, one process row per rank and one thread row per stream of
// work (the training thread, each process group's collectives, I/O threads). docs/trace.md.
#pragma once

#include <string>

namespace shardtrain {

// Merges every RUN_DIR/trace/rank_N.json into one trace at `out_path` (written through a
// temporary file and a rename), which Perfetto's UI and chrome://tracing open as is. Returns the
// number of ranks merged. Not collective: one process reads every rank's file. Throws
// std::invalid_argument when the run has no trace or a rank's file is not a trace, naming the
// file, and std::filesystem::filesystem_error when the output cannot be renamed into place.
int merge_traces(const std::string& run_dir, const std::string& out_path);

}  // namespace shardtrain
