#include "report/run_data.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <stdexcept>
#include <unordered_map>

#include "shardtrain/report.h"

namespace fs = std::filesystem;

namespace shardtrain::detail {
namespace {

// Notes about single lines stop after this many; one more line counts the rest.
constexpr int kMaxLineNotes = 10;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument("cannot read '" + path.string() + "'");
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

ojson parse_json_file(const fs::path& path) {
  try {
    return ojson::parse(read_file(path));
  } catch (const ojson::parse_error& e) {
    throw std::invalid_argument("'" + path.string() + "' is not valid JSON (" + e.what() + ")");
  }
}

int64_t positive_integer(const ojson& run, const std::string& key, const fs::path& file) {
  const ojson* v = find_path(run, key);
  if (!v) throw std::invalid_argument("'" + file.string() + "' has no " + key);
  if (!v->is_number_integer() || v->get<int64_t>() < 1) {
    throw std::invalid_argument("'" + file.string() + "': " + key +
                                " must be a positive integer, found " + v->dump());
  }
  return v->get<int64_t>();
}

double number_or_zero(const ojson& run, const std::string& key) {
  const ojson* v = find_path(run, key);
  return v && v->is_number() ? v->get<double>() : 0.0;
}

std::string string_or_empty(const ojson& run, const std::string& key) {
  const ojson* v = find_path(run, key);
  return v && v->is_string() ? v->get<std::string>() : std::string();
}

// Model FLOPs per trained token (PaLM's appendix B, as nanoGPT's estimate_mfu): 6 per parameter
// (2 forward, 4 backward: input and weight gradients) plus attention's scores and weighted sum,
// 12·L·d·T. A LoRA run never computes the frozen base's weight gradients, so 4 per parameter;
// the adapters' own FLOPs (rank r ≪ d) are left out. Recomputation under activation
// checkpointing is not counted: this is model FLOPs utilization, not hardware FLOPs. A
// mixture-of-experts model counts the parameters a token computes with (active_parameters).
void set_flops_per_token(RunData& data) {
  const double active = number_or_zero(data.run, "model.active_parameters");
  const double n = active > 0 ? active : number_or_zero(data.run, "model.num_parameters");
  const double layers = number_or_zero(data.run, "model.n_layers");
  const double d = number_or_zero(data.run, "model.d_model");
  double t = number_or_zero(data.run, "train.seq_len");
  if (n <= 0 || layers <= 0 || d <= 0 || t <= 0) {
    data.notes.push_back("MFU unknown: run.json's model lacks num_parameters, n_layers or d_model");
    return;
  }
  const ojson* lora = find_path(data.run, "lora");
  const bool is_lora = lora && lora->is_object() && number_or_zero(data.run, "lora.rank") > 0;
  const double per_param = is_lora ? 4.0 : 6.0;
  data.flops_per_token = per_param * n + 12.0 * layers * d * t;
  char text[256];
  std::snprintf(text, sizeof(text), "%.0f·N + 12·L·d·T = %.0f·%.0f + 12·%.0f·%.0f·%.0f%s%s",
                per_param, per_param, n, layers, d, t,
                is_lora ? " (LoRA: the frozen base has no weight gradients)" : "",
                active > 0 ? " (N: the active parameters of the mixture of experts)" : "");
  data.flops_formula = text;
}

std::string compute_dtype(const ojson& run) {
  for (const char* key : {"precision.param_dtype", "precision.autocast"}) {
    const std::string v = string_or_empty(run, key);
    if (v == "bf16" || v == "bfloat16") return "bf16";
    if (v == "fp16" || v == "float16" || v == "half") return "fp16";
  }
  return "fp32";
}

void load_run_json(RunData& data, const fs::path& file) {
  data.run = parse_json_file(file);
  if (!data.run.is_object()) {
    throw std::invalid_argument("'" + file.string() + "' is not a JSON object");
  }
  data.has_run = true;
  data.world_size = static_cast<int>(positive_integer(data.run, "world_size", file));
  const ojson* model = find_path(data.run, "model");
  if (!model || !model->is_object()) {
    throw std::invalid_argument("'" + file.string() + "' has no model object");
  }
  for (const char* key : {"train.seq_len", "train.micro_batch", "train.grad_accum"}) {
    positive_integer(data.run, key, file);
  }
  if (find_path(data.run, "train.steps")) {
    data.steps_planned = positive_integer(data.run, "train.steps", file);
  }
  data.compute_dtype = compute_dtype(data.run);
  set_flops_per_token(data);
}

void load_scaling(RunData& data, const fs::path& file) {
  data.scaling = parse_json_file(file);
  const auto rows = data.scaling.is_object() ? data.scaling.find("rows") : data.scaling.end();
  if (rows == data.scaling.end() || !rows->is_array()) {
    throw std::invalid_argument("'" + file.string() + "' has no rows array");
  }
  for (const auto& row : *rows) {
    if (!row.is_object() || !row.contains("ranks") || !row["ranks"].is_number()) {
      throw std::invalid_argument("'" + file.string() +
                                  "': every row needs a number of ranks, found " + row.dump());
    }
  }
  data.has_scaling = true;
}

}  // namespace

const ojson* find_path(const ojson& root, const std::string& dotted) {
  const ojson* node = &root;
  size_t start = 0;
  while (true) {
    const size_t dot = dotted.find('.', start);
    const std::string key = dotted.substr(start, dot == std::string::npos ? dot : dot - start);
    if (!node->is_object()) return nullptr;
    const auto it = node->find(key);
    if (it == node->end()) return nullptr;
    node = &*it;
    if (dot == std::string::npos) return node;
    start = dot + 1;
  }
}

void flatten_json(const ojson& value, const std::string& prefix,
                  std::vector<std::pair<std::string, ojson>>& out) {
  if (value.is_object() && !value.empty()) {
    for (auto it = value.begin(); it != value.end(); ++it) {
      flatten_json(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
    }
    return;
  }
  out.emplace_back(prefix, value);
}

int MetricsTable::column(const std::string& name) const {
  const auto it = std::find(columns.begin(), columns.end(), name);
  return it == columns.end() ? -1 : static_cast<int>(it - columns.begin());
}

int64_t MetricsTable::distinct_steps() const {
  std::set<int64_t> steps;
  for (const auto& row : rows) steps.insert(row[0].get<int64_t>());
  return static_cast<int64_t>(steps.size());
}

MetricsTable read_metrics(const std::string& path) {
  const std::string text = read_file(path);
  MetricsTable table;
  table.columns = {"step", "rank"};
  std::unordered_map<std::string, size_t> column_of = {{"step", 0}, {"rank", 1}};
  std::map<std::pair<int64_t, int64_t>, size_t> row_of;  // (step, rank) -> index in rows
  int skipped = 0;
  auto skip = [&](const std::string& why) {
    if (++skipped <= kMaxLineNotes) table.notes.push_back(why);
  };

  size_t start = 0;
  int64_t line_number = 0;
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    const bool last = end == std::string::npos;
    const std::string line = text.substr(start, last ? std::string::npos : end - start);
    start = last ? text.size() : end + 1;
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    ++table.lines_read;
    ojson j;
    try {
      j = ojson::parse(line);
    } catch (const ojson::parse_error&) {
      if (last) {
        // Each rank appends whole lines; only a process killed mid-write leaves a partial one,
        // and only at the end of the file.
        table.truncated_last_line = true;
        table.notes.push_back("the last line of metrics.jsonl (line " +
                              std::to_string(line_number) + ", " + std::to_string(line.size()) +
                              " bytes) is incomplete, as a run stopped while writing it leaves "
                              "it: skipped");
      } else {
        skip("line " + std::to_string(line_number) +
             " of metrics.jsonl is not valid JSON: skipped");
      }
      continue;
    }
    const auto step = j.is_object() ? j.find("step") : j.end();
    const auto rank = j.is_object() ? j.find("rank") : j.end();
    if (step == j.end() || rank == j.end() || !step->is_number_integer() ||
        !rank->is_number_integer()) {
      skip("line " + std::to_string(line_number) +
           " of metrics.jsonl has no integer step and rank: skipped");
      continue;
    }
    std::vector<std::pair<std::string, ojson>> flat;
    flatten_json(j, "", flat);
    std::vector<ojson> row(table.columns.size());
    for (auto& [key, value] : flat) {
      auto [it, added] = column_of.emplace(key, table.columns.size());
      if (added) table.columns.push_back(key);
      if (it->second >= row.size()) row.resize(it->second + 1);
      row[it->second] = std::move(value);
    }
    // A resumed run repeats the steps after its checkpoint: the later line is the one that
    // counts.
    const auto key = std::make_pair(step->get<int64_t>(), rank->get<int64_t>());
    const auto found = row_of.find(key);
    if (found != row_of.end()) {
      table.rows[found->second] = std::move(row);
    } else {
      row_of.emplace(key, table.rows.size());
      table.rows.push_back(std::move(row));
    }
  }
  if (skipped > kMaxLineNotes) {
    table.notes.push_back("and " + std::to_string(skipped - kMaxLineNotes) +
                          " more lines of metrics.jsonl skipped");
  }
  for (auto& row : table.rows) row.resize(table.columns.size());
  std::sort(table.rows.begin(), table.rows.end(), [](const auto& a, const auto& b) {
    const auto ka = std::make_pair(a[0].template get<int64_t>(), a[1].template get<int64_t>());
    const auto kb = std::make_pair(b[0].template get<int64_t>(), b[1].template get<int64_t>());
    return ka < kb;
  });
  return table;
}

RunData load_run(const std::string& run_dir) {
  const fs::path dir(run_dir);
  if (!fs::exists(dir)) throw std::invalid_argument("report: '" + run_dir + "' does not exist");
  if (!fs::is_directory(dir)) {
    throw std::invalid_argument("report: '" + run_dir + "' is not a directory");
  }
  RunData data;
  data.dir = run_dir;
  const bool has_run_json = fs::exists(dir / "run.json");
  data.has_metrics_file = fs::exists(dir / "metrics.jsonl");
  const bool has_scaling = fs::exists(dir / "scaling.json");
  if (!has_run_json && !data.has_metrics_file && !has_scaling) {
    throw std::invalid_argument("report: '" + run_dir +
                                "' is not a run directory: it has no run.json and no "
                                "metrics.jsonl (nor a scaling.json from `shardtrain bench "
                                "scaling`)");
  }
  if (has_run_json) {
    load_run_json(data, dir / "run.json");
  } else if (data.has_metrics_file) {
    data.notes.push_back("no run.json: the settings, the planned steps and MFU are unknown");
  }
  if (has_scaling) load_scaling(data, dir / "scaling.json");
  if (data.has_metrics_file) {
    data.metrics = read_metrics((dir / "metrics.jsonl").string());
    for (const auto& note : data.metrics.notes) data.notes.push_back(note);
    if (!data.metrics.rows.empty()) data.last_step = data.metrics.rows.back()[0].get<int64_t>();
  } else if (has_run_json) {
    data.notes.push_back("no metrics.jsonl yet: the run has not finished a step");
  }
  if (data.has_metrics_file && data.metrics.rows.empty()) {
    data.notes.push_back("metrics.jsonl holds no steps yet");
  }
  data.traces = read_traces(run_dir);
  return data;
}

}  // namespace shardtrain::detail

namespace shardtrain {

RunInfo describe_run(const std::string& run_dir) {
  const detail::RunData data = detail::load_run(run_dir);
  RunInfo info;
  info.world_size = data.world_size;
  info.compute_dtype = data.compute_dtype;
  info.steps_recorded = data.metrics.distinct_steps();
  info.flops_per_token = data.flops_per_token;
  info.skipped = data.metrics.notes;
  return info;
}

}  // namespace shardtrain
