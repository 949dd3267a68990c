#include "report/sections.h"

#include <algorithm>
#include <map>

#include "common/stats.h"
#include "report/html.h"

namespace shardtrain::detail {
namespace {

std::string chart(const std::string& name) {
  return "<div class=\"chart\" data-chart=\"" + name + "\"></div>\n";
}

// The global (lowest-rank) value of `column` at every step.
std::vector<double> per_step(const MetricsTable& table, const std::string& column) {
  const int c = table.column(column);
  std::vector<double> out;
  for (const size_t i : first_row_per_step(table)) out.push_back(number_at(table.rows[i], c));
  return out;
}

const ojson* run_value(const RunData& data, const std::string& dotted) {
  return find_path(data.run, dotted);
}

std::string run_text(const RunData& data, const std::string& dotted) {
  const ojson* v = run_value(data, dotted);
  return v ? escape_html(format_leaf(*v)) : "";
}

// The last row of each rank (its latest step), by rank.
std::map<int64_t, const std::vector<ojson>*> last_row_per_rank(const MetricsTable& table) {
  std::map<int64_t, const std::vector<ojson>*> last;
  for (const auto& row : table.rows) last[row[1].get<int64_t>()] = &row;
  return last;
}

}  // namespace

std::vector<size_t> first_row_per_step(const MetricsTable& table) {
  std::vector<size_t> out;
  for (size_t i = 0; i < table.rows.size(); ++i) {
    if (i == 0 || table.rows[i][0] != table.rows[i - 1][0]) out.push_back(i);
  }
  return out;
}

Peak run_peak(const RunData& data, const ReportOptions& options) {
  Peak peak;
  if (options.peak_flops() <= 0) return peak;
  peak.source = options.peak_source();
  if (options.peak_shared() || data.world_size <= 1) {
    peak.total = options.peak_flops();
    peak.per_rank = options.peak_shared() ? 0 : options.peak_flops();
    peak.description = format_flops(peak.total) +
                       (options.peak_shared() && data.world_size > 1
                            ? " shared by the " + std::to_string(data.world_size) + " ranks"
                            : "");
  } else {
    peak.per_rank = options.peak_flops();
    peak.total = peak.per_rank * data.world_size;
    peak.description = format_flops(peak.per_rank) + " per rank × " +
                       std::to_string(data.world_size) + " ranks = " + format_flops(peak.total);
  }
  if (!peak.source.empty()) peak.description += " (" + peak.source + ")";
  return peak;
}

std::string banners(const RunData& data) {
  std::string out;
  if (data.steps_planned > 0 && data.last_step < data.steps_planned) {
    out += "<p class=\"banner progress\" id=\"in-progress\">in progress: step " +
           std::to_string(std::max<int64_t>(data.last_step, 0)) + " of " +
           std::to_string(data.steps_planned) +
           " (or stopped before its last step; this page shows what metrics.jsonl held when it "
           "was written)</p>\n";
  }
  for (const auto& note : data.notes) {
    out += "<p class=\"banner note\">" + escape_html(note) + "</p>\n";
  }
  return out;
}

std::string summary_section(const RunData& data, const Peak& peak) {
  std::vector<std::vector<std::string>> rows;
  auto add = [&](const std::string& key, const std::string& value) {
    if (!value.empty()) rows.push_back({key, value});
  };
  add("Run directory", escape_html(data.dir));
  if (data.has_run) {
    std::string model = run_text(data, "model.name");
    const std::string family = run_text(data, "model.family");
    if (!family.empty()) model += " (" + family + ")";
    const ojson* n = run_value(data, "model.num_parameters");
    if (n && n->is_number()) model += ", " + format_number(n->get<double>()) + " parameters";
    add("Model", model);
    const std::string strategy = run_text(data, "parallel.strategy");
    add("Ranks", std::to_string(data.world_size) + (strategy.empty() ? "" : ", " + strategy));
    add("Compute dtype", data.compute_dtype);
  }
  const int64_t recorded = data.metrics.distinct_steps();
  if (data.has_run || data.has_metrics_file) {
    std::string steps =
        data.last_step < 0 ? "none yet" : "last step " + std::to_string(data.last_step);
    steps += data.steps_planned > 0 ? " of " + std::to_string(data.steps_planned) + " planned"
                                    : " (steps planned: unknown)";
    steps += ", " + std::to_string(recorded) + " step" + (recorded == 1 ? "" : "s") + " recorded";
    add("Steps", steps);
  }
  if (recorded > 0) {
    const MetricsTable& t = data.metrics;
    const auto losses = per_step(t, "loss");
    add("Last loss", format_number(losses.back()));
    const int eval = t.column("eval_loss");
    double last_eval = NAN, best_eval = NAN;
    int64_t last_eval_step = -1;
    for (const size_t i : first_row_per_step(t)) {
      // Any rank's evaluation loss of the step (they are equal): the lowest that has one.
      for (size_t j = i; j < t.rows.size() && t.rows[j][0] == t.rows[i][0]; ++j) {
        const double v = number_at(t.rows[j], eval);
        if (std::isnan(v)) continue;
        last_eval = v;
        last_eval_step = t.rows[j][0].get<int64_t>();
        if (std::isnan(best_eval) || v < best_eval) best_eval = v;
        break;
      }
    }
    if (last_eval_step >= 0) {
      add("Evaluation loss", format_number(last_eval) + " at step " +
                                 std::to_string(last_eval_step) + " (best " +
                                 format_number(best_eval) + ")");
    }
    const double tokens = median(per_step(t, "tokens_per_s"));
    add("Tokens/s (median over steps)", format_number(tokens));
    if (data.flops_per_token > 0) {
      add("Model FLOPs per token",
          format_number(data.flops_per_token) + " = " + escape_html(data.flops_formula));
    }
    if (peak.total > 0 && data.flops_per_token > 0) {
      add("MFU (median tokens/s)", format_percent(tokens * data.flops_per_token / peak.total));
    }
    double sum = 0;
    for (const double s : per_step(t, "step_time_s")) sum += std::isnan(s) ? 0 : s;
    add("Time in steps (sum)", format_seconds(sum));
    // elapsed_s counts from the process's first step: a resumed run's starts again at its resume.
    add("Elapsed at the last step", format_seconds(per_step(t, "elapsed_s").back()));
  }
  if (peak.total > 0) add("Peak FLOP/s", escape_html(peak.description));
  return "<section id=\"summary\"><h2>Summary</h2>\n" + html_table({"", ""}, rows, 2, "kv") +
         "</section>\n";
}

std::string training_section(const RunData& data) {
  const MetricsTable& t = data.metrics;
  if (t.rows.empty()) return "";
  std::string out = "<section id=\"training\"><h2>Loss and learning rate</h2>\n";
  if (t.column("loss") >= 0) out += chart("loss");
  if (t.column("lr") >= 0) out += chart("lr");
  if (t.column("grad_norm") >= 0) out += chart("grad_norm");
  // A mixture-of-experts run: its routing.
  if (t.column("expert_tokens.mean") >= 0) out += chart("experts");
  return out + "</section>\n";
}

std::string throughput_section(const RunData& data, const Peak& peak) {
  if (data.metrics.rows.empty() || data.metrics.column("tokens_per_s") < 0) return "";
  std::string out = "<section id=\"throughput\"><h2>Throughput and MFU</h2>\n";
  out += chart("throughput");
  if (peak.total > 0 && data.flops_per_token > 0) {
    out +=
        "<p>MFU = tokens/s × model FLOPs per token / peak FLOP/s of all ranks; FLOPs per "
        "token " +
        escape_html(data.flops_formula) + "; peak " + escape_html(peak.description) + ".</p>\n";
  } else if (data.flops_per_token > 0) {
    out +=
        "<p>No MFU: no peak FLOP/s was given (<code>shardtrain report --device NAME</code> "
        "or <code>--peak-tflops X</code>).</p>\n";
  }
  return out + "</section>\n";
}

std::string memory_section(const RunData& data) {
  const MetricsTable& t = data.metrics;
  std::vector<std::string> kinds;
  for (const char* k :
       {"params", "grads", "optim", "gathered_peak", "activations_peak", "peak_rss"}) {
    if (t.column(std::string("mem.") + k) >= 0) kinds.push_back(k);
  }
  for (const auto& c : t.columns) {  // any other kind a newer trainer writes
    if (c.rfind("mem.", 0) == 0 &&
        std::find(kinds.begin(), kinds.end(), c.substr(4)) == kinds.end()) {
      kinds.push_back(c.substr(4));
    }
  }
  if (t.rows.empty() || kinds.empty()) return "";
  std::vector<std::string> header = {"rank", "step"};
  for (const auto& k : kinds) header.push_back(escape_html(k));
  std::vector<std::vector<std::string>> rows;
  for (const auto& [rank, row] : last_row_per_rank(t)) {
    std::vector<std::string> cells = {std::to_string(rank), (*row)[0].dump()};
    for (const auto& k : kinds)
      cells.push_back(format_bytes(number_at(*row, t.column("mem." + k))));
    rows.push_back(std::move(cells));
  }
  std::string out = "<section id=\"memory\"><h2>Memory per rank</h2>\n";
  out +=
      "<p>At each rank's last recorded step. params, grads and optim are what the rank holds "
      "of them; activations_peak and gathered_peak are peaks within the step; peak_rss is "
      "the process's peak resident memory so far.</p>\n";
  out += html_table(header, rows, 1);
  if (t.column("mem.peak_rss") >= 0) out += chart("memory");
  return out + "</section>\n";
}

std::string comm_section(const RunData& data) {
  const MetricsTable& t = data.metrics;
  const int seconds = t.column("comm.seconds");
  if (t.rows.empty() || seconds < 0) return "";
  const int exposed = t.column("comm.exposed_seconds");
  const int bytes = t.column("comm.bytes");
  struct Sums {
    double seconds = 0, exposed = 0, bytes = 0;
    int steps = 0;
  };
  std::map<int64_t, Sums> by_rank;
  for (const auto& row : t.rows) {
    const double s = number_at(row, seconds);
    if (std::isnan(s)) continue;
    Sums& sums = by_rank[row[1].get<int64_t>()];
    sums.seconds += s;
    const double e = number_at(row, exposed), b = number_at(row, bytes);
    sums.exposed += std::isnan(e) ? 0 : e;
    sums.bytes += std::isnan(b) ? 0 : b;
    ++sums.steps;
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& [rank, s] : by_rank) {
    rows.push_back({std::to_string(rank), format_seconds(s.seconds / s.steps),
                    exposed >= 0 ? format_seconds(s.exposed / s.steps) : "",
                    exposed >= 0 && s.seconds > 0 ? format_percent(1 - s.exposed / s.seconds) : "",
                    bytes >= 0 ? format_bytes(s.bytes / s.steps) : ""});
  }
  std::string out = "<section id=\"comm\"><h2>Communication</h2>\n";
  out +=
      "<p>Per step: time in collectives, the part of it the step waited for (exposed), and "
      "the fraction hidden behind compute = 1 − exposed / communication time. The chart "
      "shows the mean over ranks.</p>\n";
  out += html_table({"rank", "comm per step", "exposed per step", "hidden", "bytes per step"}, rows,
                    1);
  out += chart("comm");
  return out + "</section>\n";
}

std::string trace_section(const RunData& data) {
  if (data.traces.empty()) return "";
  std::string out = "<section id=\"traces\"><h2>Where the time went</h2>\n";
  out +=
      "<p>From the traces in <code>trace/</code>: the time of each category of events on "
      "each thread row within each traced step (nested events of one category count once; "
      "the share is of the step's duration). To see the timeline, open a file at "
      "<a href=\"https://ui.perfetto.dev\">ui.perfetto.dev</a> → Open trace file; "
      "<code>shardtrain trace merge RUN_DIR</code> makes one file of all ranks.</p>\n";
  for (const auto& trace : data.traces) {
    out += "<h3>rank " + std::to_string(trace.rank) + " <small>" + escape_html(trace.file) +
           "</small></h3>\n";
    if (!trace.error.empty()) {
      out += "<p class=\"banner note\">could not read this trace: " + escape_html(trace.error) +
             "</p>\n";
      continue;
    }
    if (trace.steps.empty()) {
      out +=
          "<p>No step spans (<code>step N</code>, category <code>step</code>) in this "
          "trace.</p>\n";
      continue;
    }
    std::vector<std::string> header = {"step", "row", "step time"};
    for (const auto& c : trace.categories) header.push_back(escape_html(c));
    std::vector<std::vector<std::string>> rows;
    for (const auto& step : trace.steps) {
      for (const auto& [row, by_cat] : step.rows) {
        std::vector<std::string> cells = {std::to_string(step.step), escape_html(row),
                                          format_seconds(step.step_us * 1e-6)};
        for (const auto& c : trace.categories) {
          const auto it = by_cat.find(c);
          cells.push_back(it == by_cat.end() ? ""
                                             : format_seconds(it->second * 1e-6) + " (" +
                                                   format_percent(it->second / step.step_us) + ")");
        }
        rows.push_back(std::move(cells));
      }
    }
    out += html_table(header, rows, 2);
  }
  return out + "</section>\n";
}

std::string scaling_section(const RunData& data) {
  if (!data.has_scaling) return "";
  const ojson& s = data.scaling;
  std::string out = "<section id=\"scaling\"><h2>Scaling</h2>\n<p>From scaling.json (" +
                    escape_html(s.contains("mode") ? format_leaf(s["mode"]) : "?") + " scaling" +
                    (s.contains("model") ? ", model " + escape_html(format_leaf(s["model"])) : "") +
                    ", written by <code>shardtrain bench scaling</code>).</p>\n";
  struct Column {
    std::string key;
    std::string title;
    char kind;  // t: text, n: number, s: seconds, p: percent, b: bytes
  };
  std::vector<Column> columns = {{"strategy", "strategy", 't'},
                                 {"ranks", "ranks", 'n'},
                                 {"global_batch", "global batch", 'n'},
                                 {"tokens_per_s", "tokens/s", 'n'},
                                 {"step_time_s", "step time", 's'},
                                 {"efficiency", "efficiency", 'p'},
                                 {"compute_s", "compute", 's'},
                                 {"comm_s", "comm", 's'},
                                 {"comm_exposed_s", "comm exposed", 's'},
                                 {"other_s", "other", 's'},
                                 {"peak_rss", "peak RSS", 'b'}};
  // Keys a row has beyond these (a newer `bench scaling`'s), after them: seconds by their "_s".
  for (const auto& row : s["rows"]) {
    for (auto it = row.begin(); it != row.end(); ++it) {
      const std::string& key = it.key();
      if (std::none_of(columns.begin(), columns.end(),
                       [&](const Column& c) { return c.key == key; })) {
        const bool seconds = key.size() > 2 && key.compare(key.size() - 2, 2, "_s") == 0;
        columns.push_back({key, key, seconds ? 's' : 'n'});
      }
    }
  }
  std::vector<std::string> header;
  for (const auto& c : columns) header.push_back(escape_html(c.title));
  std::vector<std::vector<std::string>> rows;
  for (const auto& row : s["rows"]) {
    std::vector<std::string> cells;
    for (const auto& c : columns) {
      const auto it = row.find(c.key);
      if (it == row.end() || it->is_null()) {
        cells.push_back("");
      } else if (c.kind == 't' || !it->is_number()) {
        cells.push_back(escape_html(format_leaf(*it)));
      } else {
        const double v = it->get<double>();
        cells.push_back(c.kind == 's'   ? format_seconds(v)
                        : c.kind == 'p' ? format_percent(v)
                        : c.kind == 'b' ? format_bytes(v)
                                        : format_number(v));
      }
    }
    rows.push_back(std::move(cells));
  }
  out += html_table(header, rows, 1);
  out += chart("scaling_tokens") + chart("scaling_efficiency");
  return out + "</section>\n";
}

std::string settings_section(const RunData& data) {
  if (!data.has_run) return "";
  std::vector<std::pair<std::string, ojson>> flat;
  flatten_json(data.run, "", flat);
  std::vector<std::vector<std::string>> rows;
  for (const auto& [key, value] : flat) {
    rows.push_back({escape_html(key), escape_html(format_leaf(value))});
  }
  return "<section id=\"settings\"><h2>Settings (run.json)</h2>\n" +
         html_table({"key", "value"}, rows, 2, "kv") + "</section>\n";
}

}  // namespace shardtrain::detail
