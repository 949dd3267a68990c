// `shardtrain bench scaling`: the same training at 1, 2, 4 ... ranks under each strategy, its
// throughput and scaling efficiency, and where the time that more ranks did not save went.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.h"
#include "shardtrain/config.h"
#include "shardtrain/launch.h"

namespace shardtrain::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int64_t kWarmupSteps = 2;  // the first steps allocate and connect: not timed

struct ScalingArgs {
  std::string config = "configs/demo.toml";
  std::vector<int> ranks = {1, 2, 4};
  std::vector<std::string> strategies = {"ddp", "fsdp", "zero3"};
  std::string mode = "strong";
  int64_t steps = 12;
  std::string out = "runs/scaling";
  std::vector<std::string> overrides;
};

// --set values for a strategy name of this command.
std::vector<std::string> strategy_settings(const std::string& name) {
  if (name == "ddp") return {"parallel.strategy=\"ddp\""};
  if (name == "fsdp")
    return {"parallel.strategy=\"fsdp\"", "parallel.fsdp.sharding=\"full_shard\""};
  if (name == "zero1" || name == "zero2" || name == "zero3") {
    return {"parallel.strategy=\"zero\"", "parallel.zero.stage=" + name.substr(4)};
  }
  throw std::invalid_argument("bench scaling: unknown strategy '" + name +
                              "' (ddp, fsdp, zero1, zero2 or zero3)");
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// Means over rank 0's traced steps of where the training thread's time went: compute (forward,
// backward and the optimizer, less the waits inside them), exposed communication (every wait)
// and the rest of the step; the three add up to the mean traced step.
void add_breakdown(const fs::path& trace_file, json& row) {
  std::ifstream in(trace_file);
  if (!in) return;
  const json trace = json::parse(in);
  std::vector<std::pair<double, double>> steps, work, waits;  // [start, end] in microseconds
  for (const auto& event : trace.at("traceEvents")) {
    if (event.at("ph") != "X" || event.at("tid") != 1) continue;  // row 1: the training thread
    const double ts = event.at("ts");
    const std::pair<double, double> span{ts, ts + event.at("dur").get<double>()};
    const std::string name = event.at("name");
    if (event.at("cat") == "step") {
      steps.push_back(span);
    } else if (name == "forward" || name == "backward" || name == "optimizer") {
      work.push_back(span);
    } else if (event.at("cat") == "wait" && name != "wait for files") {
      waits.push_back(span);
    }
  }
  // Wall-clock microseconds in doubles are exact to 0.25 us: a nested span may seem to end a
  // hair after its parent.
  const auto inside = [](const std::pair<double, double>& a, const std::pair<double, double>& b) {
    constexpr double kSlackUs = 2.0;
    return a.first >= b.first - kSlackUs && a.second <= b.second + kSlackUs;
  };
  if (steps.empty()) return;
  double compute = 0, exposed = 0, other = 0, total = 0;
  for (const auto& step : steps) {
    double busy = 0, waited = 0, waited_in_work = 0;
    for (const auto& w : work) busy += inside(w, step) ? w.second - w.first : 0;
    for (const auto& w : waits) {
      if (!inside(w, step)) continue;
      waited += w.second - w.first;
      for (const auto& u : work) {
        if (inside(w, u)) {
          waited_in_work += w.second - w.first;
          break;
        }
      }
    }
    const double c = busy - waited_in_work;
    compute += c;
    exposed += waited;
    other += step.second - step.first - c - waited;
    total += step.second - step.first;
  }
  const double per_step_s = 1e-6 / static_cast<double>(steps.size());
  row["traced_step_s"] = total * per_step_s;
  row["compute_s"] = compute * per_step_s;
  row["trace_exposed_comm_s"] = exposed * per_step_s;
  row["other_s"] = other * per_step_s;
}

double mean(const std::vector<double>& values) {
  double sum = 0;
  for (double v : values) sum += v;
  return values.empty() ? 0 : sum / static_cast<double>(values.size());
}

// One run's row from rank 0's metrics.jsonl lines (steps after the warmup: the steps traced) and
// its trace. Throughput from the median step; the split of the step and the communication
// times as means over the same steps, so that they add up.
json measure(const fs::path& run, const std::string& strategy, int ranks, int64_t global_batch,
             int64_t seq_len) {
  std::vector<double> times, comm, exposed;
  int64_t peak_rss = 0;
  std::ifstream in(run / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const json m = json::parse(line);
    if (m.at("step").get<int64_t>() <= kWarmupSteps) continue;
    peak_rss = std::max(peak_rss, m.at("mem").at("peak_rss").get<int64_t>());
    if (m.at("rank") != 0) continue;
    times.push_back(m.at("step_time_s"));
    comm.push_back(m.contains("comm") ? m["comm"]["seconds"].get<double>() : 0.0);
    exposed.push_back(m.contains("comm") ? m["comm"]["exposed_seconds"].get<double>() : 0.0);
  }
  if (times.empty()) {
    throw std::runtime_error("bench scaling: " + run.string() + " recorded no timed step");
  }
  const double step = median(times);
  json row = {{"strategy", strategy},
              {"ranks", ranks},
              {"global_batch", global_batch},
              {"step_time_s", step},
              {"tokens_per_s", static_cast<double>(global_batch * seq_len) / step},
              {"comm_s", mean(comm)},
              {"comm_exposed_s", mean(exposed)},
              {"peak_rss", peak_rss}};
  add_breakdown(run / "trace" / "rank_0.json", row);
  return row;
}

std::string markdown(const json& rows, const std::string& mode) {
  std::ostringstream out;
  out << "| strategy | ranks | global batch | median step (s) | tokens/s | efficiency | mean step "
         "(s) | compute (s) | exposed comm (s) | other (s) | comm total (s) | comm hidden | "
         "peak RSS/rank (MiB) |\n"
      << "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  char line[512];
  for (const auto& r : rows) {
    const double comm = r.at("comm_s");
    const std::string hidden =
        comm > 0 ? std::to_string(static_cast<int>(
                       std::lround(100 * (1 - r.at("comm_exposed_s").get<double>() / comm)))) +
                       "%"
                 : "-";
    std::snprintf(line, sizeof(line),
                  "| %s | %d | %lld | %.3f | %.0f | %.0f%% | %.3f | %.3f | %.3f | %.3f | %.3f | "
                  "%s | %.0f |\n",
                  r.at("strategy").get<std::string>().c_str(), r.at("ranks").get<int>(),
                  static_cast<long long>(r.at("global_batch").get<int64_t>()),
                  r.at("step_time_s").get<double>(), r.at("tokens_per_s").get<double>(),
                  100 * r.at("efficiency").get<double>(), r.value("traced_step_s", 0.0),
                  r.value("compute_s", 0.0), r.value("trace_exposed_comm_s", 0.0),
                  r.value("other_s", 0.0), comm, hidden.c_str(),
                  static_cast<double>(r.at("peak_rss").get<int64_t>()) / (1 << 20));
    out << line;
  }
  out << "\n"
      << mode << " scaling: efficiency = tokens/s at N ranks / (N x tokens/s at "
      << "the fewest ranks), tokens/s from the median step. Over the same steps (all but the "
      << "first " << kWarmupSteps << "), rank 0's mean step splits into compute (forward, "
      << "backward and the optimizer less the waits in them), exposed comm (waits for "
      << "collectives, from the trace) and other; comm total is the mean time its collectives "
      << "ran, and hidden = 1 - exposed / total (both from metrics.jsonl).\n";
  return out.str();
}

void run_scaling(const ScalingArgs& a) {
  const TrainConfig base = load_train_config(a.config, a.overrides);
  std::vector<int> ranks = a.ranks;
  std::sort(ranks.begin(), ranks.end());
  const int64_t per_rank = base.train.micro_batch;
  // Strong scaling keeps the global batch of the most ranks at the config's micro-batch.
  const int64_t strong_batch = per_rank * ranks.back();
  for (int n : ranks) {
    if (a.mode == "strong" && strong_batch % n != 0) {
      throw std::invalid_argument("bench scaling: the global batch " +
                                  std::to_string(strong_batch) + " does not divide over " +
                                  std::to_string(n) + " ranks");
    }
  }
  char self[4096];
  const ssize_t length = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (length <= 0) throw std::runtime_error("bench scaling: cannot find its own executable");
  const std::string program(self, static_cast<size_t>(length));
  fs::create_directories(a.out);
  json rows = json::array();
  for (const std::string& strategy : a.strategies) {
    const std::vector<std::string> settings = strategy_settings(strategy);
    double base_rate = 0;
    int base_ranks = 0;
    for (int n : ranks) {
      const int64_t micro = a.mode == "strong" ? strong_batch / n : per_rank;
      const fs::path run = fs::absolute(fs::path(a.out) / (strategy + "_" + std::to_string(n)));
      std::vector<std::string> sets = a.overrides;
      sets.insert(sets.end(), settings.begin(), settings.end());
      for (const std::string& s :
           {"run.dir=\"" + run.string() + "\"", std::string("run.overwrite=true"),
            "train.steps=" + std::to_string(a.steps), "train.micro_batch=" + std::to_string(micro),
            std::string("train.eval_every=0"), std::string("train.sample_tokens=0"),
            std::string("train.checkpoint_every=0"), std::string("train.final_checkpoint=false"),
            std::string("run.trace=true"),
            "run.trace_steps=[" + std::to_string(kWarmupSteps + 1) + ", " +
                std::to_string(a.steps) + "]",
            "run.log_every=" + std::to_string(a.steps)}) {
        sets.push_back(s);
      }
      std::string command = shell_quoted(program) + " launch --nproc " + std::to_string(n) +
                            " --no-prefix -- " + shell_quoted(program) + " train --config " +
                            shell_quoted(a.config);
      for (const auto& s : sets) command += " --set " + shell_quoted(s);
      const fs::path log = run.string() + ".log";
      std::cout << "bench scaling: " << strategy << " on " << n << " rank(s), micro-batch " << micro
                << " ... " << std::flush;
      if (std::system((command + " > " + shell_quoted(log.string()) + " 2>&1").c_str()) != 0) {
        throw std::runtime_error("bench scaling: the run failed; see " + log.string());
      }
      json row = measure(run, strategy, n, micro * n * base.train.grad_accum, base.data.seq_len);
      if (base_ranks == 0) {
        base_rate = row["tokens_per_s"].get<double>() / n;
        base_ranks = n;
      }
      row["efficiency"] = row["tokens_per_s"].get<double>() / (base_rate * n);
      std::cout << row["tokens_per_s"].get<double>() << " tokens/s\n";
      rows.push_back(row);
    }
  }
  const json result = {{"format", 1},        {"mode", a.mode},   {"model", base.model.name},
                       {"config", a.config}, {"steps", a.steps}, {"rows", rows}};
  std::ofstream(fs::path(a.out) / "scaling.json") << result.dump(2) << "\n";
  const std::string table = markdown(rows, a.mode);
  std::ofstream(fs::path(a.out) / "scaling.md") << table;
  std::cout << table << "wrote " << (fs::path(a.out) / "scaling.json").string()
            << " (shardtrain report " << a.out << " draws it)\n";
}

}  // namespace

void add_bench_scaling_command(CLI::App& bench) {
  auto* cmd = bench.add_subcommand(
      "scaling",
      "Train the same model at 1, 2, 4 ... local ranks under each strategy; report throughput, "
      "scaling efficiency and where the time went (from each run's trace)");
  auto a = std::make_shared<ScalingArgs>();
  cmd->add_option("--config,-c", a->config, "The training config")->capture_default_str();
  cmd->add_option("--ranks", a->ranks, "Rank counts to run (comma-separated)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--strategies", a->strategies, "ddp, fsdp (full_shard), zero1, zero2, zero3")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--mode", a->mode,
                  "strong: one global batch (the config's micro-batch at the most ranks) split "
                  "over the ranks; weak: the config's micro-batch on every rank")
      ->capture_default_str()
      ->check(CLI::IsMember({"strong", "weak"}));
  cmd->add_option("--steps", a->steps, "Steps per run (the first 2 are not timed)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{3}, int64_t{1} << 30));
  cmd->add_option("--out,-o", a->out, "Directory for the runs, scaling.json and scaling.md")
      ->capture_default_str();
  cmd->add_option("--set", a->overrides, "Override a config key for every run (repeatable)");
  cmd->callback([a] {
    for (const auto& s : a->strategies) strategy_settings(s);  // unknown names fail first
    run_scaling(*a);
  });
}

}  // namespace shardtrain::cli
