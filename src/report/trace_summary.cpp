// "Where the time went": the Chrome trace-event files the tracer writes (trace/rank_N.json),
// summed by category on each thread row within each traced step.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <set>

#include "report/run_data.h"

namespace fs = std::filesystem;

namespace shardtrain::detail {
namespace {

struct Interval {
  double start, end;
};

// Total length covered by `intervals` (overlaps counted once).
double union_length(std::vector<Interval>& intervals) {
  std::sort(intervals.begin(), intervals.end(),
            [](const Interval& a, const Interval& b) { return a.start < b.start; });
  double total = 0, open_start = 0, open_end = -1e300;
  for (const auto& i : intervals) {
    if (i.start > open_end) {
      if (open_end > open_start) total += open_end - open_start;
      open_start = i.start;
      open_end = i.end;
    } else {
      open_end = std::max(open_end, i.end);
    }
  }
  if (open_end > open_start) total += open_end - open_start;
  return total;
}

struct StepSpan {
  int64_t step;
  double start, end;
};

RankTrace summarize(int rank, const fs::path& file) {
  RankTrace trace;
  trace.rank = rank;
  trace.file = file.string();
  ojson doc;
  try {
    std::ifstream in(file, std::ios::binary);
    doc = ojson::parse(std::string(std::istreambuf_iterator<char>(in), {}));
  } catch (const ojson::parse_error& e) {
    trace.error = std::string("not valid JSON (") + e.what() + ")";
    return trace;
  }
  const auto events = doc.is_object() ? doc.find("traceEvents") : doc.end();
  if (events == doc.end() || !events->is_array()) {
    trace.error = "no traceEvents array";
    return trace;
  }
  std::map<int64_t, std::string> row_names;  // tid -> thread_name
  std::vector<StepSpan> steps;
  static const std::regex step_name(R"(step (\d+))");
  for (const auto& e : *events) {
    if (!e.is_object()) continue;
    const std::string ph = e.value("ph", "");
    const std::string name = e.value("name", "");
    if (ph == "M" && name == "thread_name" && e.contains("tid") && e["tid"].is_number_integer()) {
      const auto args = e.find("args");
      if (args != e.end() && args->is_object() && args->contains("name")) {
        row_names[e["tid"].get<int64_t>()] = args->value("name", "");
      }
    }
    std::smatch m;
    if (ph == "X" && e.value("cat", "") == "step" && std::regex_match(name, m, step_name) &&
        m[1].length() < 18 && e.contains("ts") && e["ts"].is_number() && e.contains("dur") &&
        e["dur"].is_number()) {
      const double ts = e["ts"].get<double>();
      steps.push_back({std::stoll(m[1].str()), ts, ts + e["dur"].get<double>()});
    }
  }
  std::sort(steps.begin(), steps.end(),
            [](const StepSpan& a, const StepSpan& b) { return a.start < b.start; });

  // (step index, row, category) -> the category's events on that row, clipped to the step.
  std::map<std::tuple<size_t, std::string, std::string>, std::vector<Interval>> pieces;
  std::set<std::string> categories;
  for (const auto& e : *events) {
    if (!e.is_object() || e.value("ph", "") != "X") continue;
    const std::string cat = e.value("cat", "");
    if (cat == "step" || !e.contains("ts") || !e["ts"].is_number() || !e.contains("dur") ||
        !e["dur"].is_number()) {
      continue;
    }
    const double start = e["ts"].get<double>();
    const double end = start + e["dur"].get<double>();
    const int64_t tid =
        e.contains("tid") && e["tid"].is_number_integer() ? e["tid"].get<int64_t>() : 0;
    const auto named = row_names.find(tid);
    const std::string row =
        named != row_names.end() ? named->second : "thread " + std::to_string(tid);
    for (size_t s = 0; s < steps.size(); ++s) {
      const double lo = std::max(start, steps[s].start), hi = std::min(end, steps[s].end);
      if (hi <= lo) continue;
      pieces[{s, row, cat.empty() ? "(none)" : cat}].push_back({lo, hi});
      categories.insert(cat.empty() ? "(none)" : cat);
    }
  }
  trace.categories.assign(categories.begin(), categories.end());
  for (size_t s = 0; s < steps.size(); ++s) {
    TraceStep step;
    step.step = steps[s].step;
    step.step_us = steps[s].end - steps[s].start;
    trace.steps.push_back(std::move(step));
  }
  for (auto& [key, intervals] : pieces) {
    const auto& [s, row, cat] = key;
    trace.steps[s].rows[row][cat] = union_length(intervals);
  }
  return trace;
}

}  // namespace

std::vector<RankTrace> read_traces(const std::string& run_dir) {
  std::vector<RankTrace> traces;
  const fs::path dir = fs::path(run_dir) / "trace";
  if (!fs::is_directory(dir)) return traces;
  static const std::regex file_name(R"(rank_(\d+)\.json)");
  std::vector<std::pair<int, fs::path>> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    std::smatch m;
    if (entry.is_regular_file() && std::regex_match(name, m, file_name) && m[1].length() < 9) {
      files.emplace_back(std::stoi(m[1].str()), entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  for (const auto& [rank, path] : files) {
    try {
      traces.push_back(summarize(rank, path));
    } catch (const std::exception& e) {  // a field of the wrong type, a step number too large
      RankTrace bad;
      bad.rank = rank;
      bad.file = path.string();
      bad.error = e.what();
      traces.push_back(std::move(bad));
    }
  }
  return traces;
}

}  // namespace shardtrain::detail
