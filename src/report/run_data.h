// What `shardtrain report` reads from a run directory, checked and put in order, before any HTML
// is written: run.json, metrics.jsonl as a table, the traces' time breakdown, scaling.json.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace shardtrain::detail {

using ojson = nlohmann::ordered_json;

// metrics.jsonl as one table: a column per flattened key ("mem.peak_rss"), in the order keys
// first appear, "step" and "rank" first; one row per (step, rank), sorted by step then rank, the
// file's later line winning when a resumed run repeated a step. A key a line lacks is null.
struct MetricsTable {
  std::vector<std::string> columns;
  std::vector<std::vector<ojson>> rows;
  std::vector<std::string> notes;    // lines skipped and why, for the page
  bool truncated_last_line = false;  // the file ends in a partial line (a run killed mid-write)
  int64_t lines_read = 0;            // non-empty lines, kept or not

  // Index of `column`, or -1.
  int column(const std::string& name) const;
  int64_t distinct_steps() const;
};

// Reads RUN_DIR/metrics.jsonl (which must exist). Malformed lines are skipped and noted.
MetricsTable read_metrics(const std::string& path);

// Time by category on each thread row of one traced step of one rank, from trace/rank_N.json.
struct TraceStep {
  int64_t step = 0;
  double step_us = 0;  // the "step N" span's duration
  // Row (thread name) -> category -> microseconds: the union of the row's events of that
  // category within the step, so nested spans of one category count once.
  std::map<std::string, std::map<std::string, double>> rows;
};
struct RankTrace {
  int rank = 0;
  std::string file;
  std::vector<std::string> categories;  // every category seen, sorted
  std::vector<TraceStep> steps;
  std::string error;  // the file could not be read; the page says so instead of a table
};

// Every RUN_DIR/trace/rank_N.json, by rank. A file that cannot be parsed gives an entry with
// `error` set rather than an exception: traces are optional to the report.
std::vector<RankTrace> read_traces(const std::string& run_dir);

// Everything the page is made from.
struct RunData {
  std::string dir;
  bool has_run = false;
  ojson run;  // run.json (an object) when has_run
  bool has_metrics_file = false;
  MetricsTable metrics;
  std::vector<RankTrace> traces;
  bool has_scaling = false;
  ojson scaling;                   // scaling.json when has_scaling
  std::vector<std::string> notes;  // shown at the top of the page

  int world_size = 0;
  int64_t steps_planned = -1;  // -1: run.json does not say (older runs)
  int64_t last_step = -1;      // -1: no step recorded
  double flops_per_token = 0;  // 0: unknown
  std::string flops_formula;   // the formula with the run's numbers, for the page
  std::string compute_dtype = "fp32";
};

// Reads and checks `run_dir`; throws std::invalid_argument for bad input (see report.h).
RunData load_run(const std::string& run_dir);

// The value at a dotted path ("train.steps") of nested objects, or nullptr.
const ojson* find_path(const ojson& root, const std::string& dotted);

// Flattens nested objects into "a.b.c" keys, in order; arrays and scalars are leaves.
void flatten_json(const ojson& value, const std::string& prefix,
                  std::vector<std::pair<std::string, ojson>>& out);

}  // namespace shardtrain::detail
