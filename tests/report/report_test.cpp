// `shardtrain report`: the page's data block equals the run's files, and every kind of bad or
// partial run directory is reported as the docs say. Run directories are written here by hand,
// and one is trained.
// (tests/report/render_test.sh checks the page in a browser.)
#include "shardtrain/report.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>

#include "app.h"
#include "shardtrain/rendezvous.h"
#include "shardtrain/train.h"
#include "support.h"
#include "train/run_config.h"

namespace shardtrain {
namespace report_test {

namespace fs = std::filesystem;
using nlohmann::json;

json run_json(int world_size, int64_t steps) {
  json run = {{"format", 1},
              {"world_size", world_size},
              {"model",
               {{"name", "gpt2-demo"},
                {"family", "gpt2"},
                {"vocab_size", 50257},
                {"context_length", 128},
                {"d_model", 128},
                {"n_layers", 4},
                {"n_heads", 4},
                {"num_parameters", 7200000}}},
              {"train", {{"micro_batch", 8}, {"grad_accum", 1}, {"seq_len", 128}}},
              {"parallel", {{"strategy", "ddp"}, {"ddp", {{"bucket_cap_mb", 25}}}}},
              {"precision", {{"param_dtype", "fp32"}, {"autocast", "none"}}}};
  if (steps > 0) run["train"]["steps"] = steps;
  return run;
}

json metrics_line(int64_t step, int rank, double loss) {
  json line = {{"step", step},
               {"rank", rank},
               {"loss", loss},
               {"lr", 0.001},
               {"grad_norm", step == 2 ? json() : json(1.5)},
               {"tokens_per_s", 4000.0},
               {"step_time_s", 0.25},
               {"loss_scale", 1.0},
               {"skipped", false},
               {"mem",
                {{"params", 28800000},
                 {"grads", 28800000},
                 {"optim", 57600000},
                 {"activations_peak", 12000000 + rank},
                 {"peak_rss", 300000000 + step * 1000 + rank}}},
               {"comm", {{"seconds", 0.05}, {"exposed_seconds", 0.01}, {"bytes", 57600000}}},
               {"elapsed_s", 0.25 * static_cast<double>(step)}};
  if (step % 2 == 0) line["eval_loss"] = loss + 0.1;
  return line;
}

void write_text(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A finished 2-rank run of `steps` steps, its ranks' lines interleaved in either order.
fs::path write_run(const fs::path& dir, int64_t steps, int64_t planned) {
  write_text(dir / "run.json", run_json(2, planned).dump(2));
  std::string lines;
  for (int64_t step = 1; step <= steps; ++step) {
    for (const int rank : step % 2 ? std::vector<int>{1, 0} : std::vector<int>{0, 1}) {
      lines += metrics_line(step, rank, 10.0 - static_cast<double>(step)).dump() + "\n";
    }
  }
  write_text(dir / "metrics.jsonl", lines);
  return dir;
}

// The JSON of the page's <script type="application/json" id="report-data">.
json report_data(const std::string& html) {
  const std::string open = "<script type=\"application/json\" id=\"report-data\">";
  const size_t start = html.find(open);
  if (start == std::string::npos) throw std::runtime_error("no report-data element");
  const size_t end = html.find("</script>", start);
  return json::parse(html.substr(start + open.size(), end - start - open.size()));
}

// Nested objects as "a.b" keys, as the data block's columns name them.
void flatten(const json& value, const std::string& prefix, std::map<std::string, json>& out) {
  if (value.is_object() && !value.empty()) {
    for (const auto& [key, v] : value.items())
      flatten(v, prefix.empty() ? key : prefix + "." + key, out);
  } else {
    out[prefix] = value;
  }
}

// Each metrics line the page should keep, by (step, rank): the file's last one.
std::map<std::pair<int64_t, int64_t>, json> expected_lines(const fs::path& file) {
  std::map<std::pair<int64_t, int64_t>, json> lines;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line);
    lines[{j["step"].get<int64_t>(), j["rank"].get<int64_t>()}] = j;
  }
  return lines;
}

void expect_data_equals_file(const json& data, const fs::path& file) {
  const auto want = expected_lines(file);
  const auto& columns = data["metrics"]["columns"];
  const auto& rows = data["metrics"]["rows"];
  ASSERT_EQ(rows.size(), want.size());
  auto it = want.begin();
  for (const auto& row : rows) {  // sorted by step, then rank
    ASSERT_EQ(row.size(), columns.size());
    std::map<std::string, json> flat;
    flatten(it->second, "", flat);
    for (size_t c = 0; c < columns.size(); ++c) {
      const auto found = flat.find(columns[c].get<std::string>());
      EXPECT_EQ(row[c], found == flat.end() ? json() : found->second)
          << "step " << it->first.first << " rank " << it->first.second << " " << columns[c];
    }
    for (const auto& [key, value] : flat) {
      EXPECT_NE(std::find(columns.begin(), columns.end(), key), columns.end()) << key;
    }
    ++it;
  }
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

class ReportTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::fresh_test_dir("shardtrain_report"); }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs the command line in-process: status and standard error.
  static std::pair<int, std::string> run_cli(const std::vector<std::string>& args) {
    std::ostringstream out, err;
    const int status = cli::run(args, out, err);
    return {status, err.str()};
  }

  fs::path dir_;
};

TEST_F(ReportTest, EmbeddedDataEqualsMetricsAndRunJson) {
  const fs::path run = write_run(dir_ / "run", 6, 6);
  const std::string html = render_report(run.string());
  const json data = report_data(html);
  expect_data_equals_file(data, run / "metrics.jsonl");
  EXPECT_EQ(data["run"], json::parse(read_text(run / "run.json")));
  EXPECT_EQ(data["status"]["last_step"], 6);
  EXPECT_EQ(data["status"]["in_progress"], false);
  EXPECT_EQ(html.find("in progress"), std::string::npos);
  // Loss, lr, grad norm, throughput, memory, communication.
  EXPECT_EQ(count(html, "data-chart=\""), 6u);
  // Settings: every key of run.json, flattened.
  EXPECT_NE(html.find("<td>parallel.ddp.bucket_cap_mb</td>"), std::string::npos);
  // uPlot is inline: the page loads nothing.
  EXPECT_NE(html.find("var uPlot="), std::string::npos);
  EXPECT_EQ(html.find("<script src"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
}

TEST_F(ReportTest, ResumedRunKeepsTheLaterLineOfARepeatedStep) {
  const fs::path run = write_run(dir_ / "run", 4, 6);
  // A resumed attempt repeats steps 3 and 4 with other losses, then goes on.
  std::ofstream out(run / "metrics.jsonl", std::ios::app);
  for (int64_t step = 3; step <= 6; ++step) {
    for (const int rank : {0, 1}) out << metrics_line(step, rank, 100.0 + step).dump() << "\n";
  }
  out.close();
  const json data = report_data(render_report(run.string()));
  expect_data_equals_file(data, run / "metrics.jsonl");
  const int loss = static_cast<int>(
      std::find(data["metrics"]["columns"].begin(), data["metrics"]["columns"].end(), "loss") -
      data["metrics"]["columns"].begin());
  EXPECT_EQ(data["metrics"]["rows"][4][loss], 103.0);  // step 3, rank 0
}

TEST_F(ReportTest, DirectoryThatIsNotARunIsOneClearError) {
  fs::create_directories(dir_ / "empty");
  try {
    render_report((dir_ / "empty").string());
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find((dir_ / "empty").string()), std::string::npos) << what;
    EXPECT_NE(what.find("no run.json and no metrics.jsonl"), std::string::npos) << what;
  }
  EXPECT_THROW(render_report((dir_ / "missing").string()), std::invalid_argument);
  write_text(dir_ / "file", "x");
  EXPECT_THROW(render_report((dir_ / "file").string()), std::invalid_argument);
}

TEST_F(ReportTest, BadRunJsonNamesTheFileAndTheKey) {
  const fs::path run = write_run(dir_ / "run", 2, 2);
  write_text(run / "run.json", "{\"world_size\": 2, \"model\": ");
  try {
    render_report(run.string());
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("run.json' is not valid JSON"), std::string::npos)
        << e.what();
  }
  json no_seq_len = run_json(2, 2);
  no_seq_len["train"].erase("seq_len");
  write_text(run / "run.json", no_seq_len.dump());
  try {
    render_report(run.string());
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("has no train.seq_len"), std::string::npos) << e.what();
  }
}

TEST_F(ReportTest, RunInProgressShowsABanner) {
  const fs::path run = write_run(dir_ / "run", 3, 100);
  const std::string html = render_report(run.string());
  EXPECT_NE(html.find("in progress: step 3 of 100"), std::string::npos);
  const json data = report_data(html);
  EXPECT_EQ(data["status"]["in_progress"], true);
  EXPECT_EQ(data["status"]["steps_planned"], 100);
  expect_data_equals_file(data, run / "metrics.jsonl");
}

TEST_F(ReportTest, OlderRunWithoutPlannedStepsSaysUnknown) {
  const fs::path run = write_run(dir_ / "run", 3, 0);
  const std::string html = render_report(run.string());
  EXPECT_NE(html.find("steps planned: unknown"), std::string::npos);
  EXPECT_EQ(html.find("in progress"), std::string::npos);
}

TEST_F(ReportTest, TruncatedLastLineIsSkippedAndSaid) {
  const fs::path run = write_run(dir_ / "run", 4, 10);
  const json whole = report_data(render_report(run.string()));
  // A rank killed while writing step 5's line.
  const std::string partial = metrics_line(5, 0, 5.0).dump().substr(0, 40);
  std::ofstream(run / "metrics.jsonl", std::ios::app | std::ios::binary) << partial;
  const std::string html = render_report(run.string());
  const json data = report_data(html);
  EXPECT_EQ(data["metrics"], whole["metrics"]);
  EXPECT_EQ(data["status"]["truncated_last_line"], true);
  EXPECT_NE(html.find("last line of metrics.jsonl (line 9, 40 bytes) is incomplete"),
            std::string::npos);
  EXPECT_NE(html.find("in progress: step 4 of 10"), std::string::npos);
}

TEST_F(ReportTest, MalformedMiddleLineIsSkippedAndSaid) {
  const fs::path run = write_run(dir_ / "run", 2, 2);
  std::string text = read_text(run / "metrics.jsonl");
  text.insert(text.find('\n') + 1, "{\"step\": 1, \"rank\"\n{\"no_step\": 1}\n");
  write_text(run / "metrics.jsonl", text);
  const std::string html = render_report(run.string());
  EXPECT_NE(html.find("line 2 of metrics.jsonl is not valid JSON: skipped"), std::string::npos);
  EXPECT_NE(html.find("line 3 of metrics.jsonl has no integer step and rank"), std::string::npos);
  EXPECT_EQ(report_data(html)["metrics"]["rows"].size(), 4u);
  // The command says it on stderr too, and still writes the page.
  const auto command =
      testing::run_command(testing::cli() + " report " + run.string() + " --peak-tflops 1");
  EXPECT_EQ(command.exit_code, 0) << command.output;
  EXPECT_NE(command.output.find(
                "shardtrain report: warning: line 2 of metrics.jsonl is not valid JSON: skipped"),
            std::string::npos)
      << command.output;
  EXPECT_TRUE(fs::exists(run / "report.html"));
}

TEST_F(ReportTest, EmptyMetricsRendersWithoutCharts) {
  const fs::path run = dir_ / "run";
  write_text(run / "run.json", run_json(2, 50).dump());
  write_text(run / "metrics.jsonl", "");
  const std::string html = render_report(run.string());
  EXPECT_NE(html.find("metrics.jsonl holds no steps yet"), std::string::npos);
  EXPECT_NE(html.find("in progress: step 0 of 50"), std::string::npos);
  EXPECT_EQ(count(html, "data-chart=\""), 0u);
  EXPECT_TRUE(report_data(html)["metrics"]["rows"].empty());
  EXPECT_FALSE(describe_run(run.string()).needs_peak());

  fs::remove(run / "metrics.jsonl");  // run.json written, no step finished yet
  EXPECT_NE(render_report(run.string()).find("no metrics.jsonl yet"), std::string::npos);
}

// A mixture-of-experts run: its routing charted, its FLOPs by the active parameters.
TEST_F(ReportTest, MixtureOfExpertsRunChartsItsRoutingAndCountsActiveParameters) {
  const fs::path run = dir_ / "run";
  json manifest = run_json(2, 2);
  manifest["model"]["active_parameters"] = 3000000;
  write_text(run / "run.json", manifest.dump());
  std::string lines;
  for (int64_t step = 1; step <= 2; ++step) {
    json line = metrics_line(step, 0, 3.0);
    line["aux_loss"] = 2.01;
    line["expert_tokens"] = {{"min", 40.0}, {"mean", 64.0}, {"max", 90.0}};
    lines += line.dump() + "\n";
  }
  write_text(run / "metrics.jsonl", lines);
  const std::string html = render_report(run.string());
  EXPECT_NE(html.find("data-chart=\"experts\""), std::string::npos);
  EXPECT_NE(html.find("6·3000000"), std::string::npos);
  EXPECT_NE(html.find("active parameters of the mixture of experts"), std::string::npos);
}

TEST_F(ReportTest, MfuUsesModelFlopsAndThePeakOfAllRanks) {
  const fs::path run = write_run(dir_ / "run", 3, 3);
  const double per_token = 6.0 * 7200000 + 12.0 * 4 * 128 * 128;
  EXPECT_DOUBLE_EQ(describe_run(run.string()).flops_per_token, per_token);
  const json data = report_data(
      render_report(run.string(), ReportOptions().peak_flops_per_rank(1e12, "test peak")));
  EXPECT_DOUBLE_EQ(data["mfu"]["flops_per_token"].get<double>(), per_token);
  EXPECT_DOUBLE_EQ(data["mfu"]["peak_flops"].get<double>(), 2e12);  // 2 ranks
  EXPECT_NE(data["mfu"]["peak"].get<std::string>().find("test peak"), std::string::npos);
  const json shared =
      report_data(render_report(run.string(), ReportOptions().peak_flops_shared(1e12, "host")));
  EXPECT_DOUBLE_EQ(shared["mfu"]["peak_flops"].get<double>(), 1e12);
  // MFU at the median tokens/s (4000 on every step) in the summary.
  const std::string html =
      render_report(run.string(), ReportOptions().peak_flops_per_rank(1e12, "test peak"));
  char mfu[32];
  std::snprintf(mfu, sizeof(mfu), "%.2f %%", 100 * 4000 * per_token / 2e12);
  EXPECT_NE(html.find(mfu), std::string::npos) << mfu;

  // LoRA: the frozen base computes no weight gradients, 4 FLOPs per parameter.
  json lora = run_json(2, 3);
  lora["lora"] = {{"rank", 8}, {"base_dtype", "bf16"}};
  lora["precision"]["autocast"] = "bf16";
  write_text(run / "run.json", lora.dump());
  const RunInfo info = describe_run(run.string());
  EXPECT_DOUBLE_EQ(info.flops_per_token, 4.0 * 7200000 + 12.0 * 4 * 128 * 128);
  EXPECT_EQ(info.compute_dtype, "bf16");
}

TEST_F(ReportTest, TraceTimeByCategoryAndRow) {
  const fs::path run = write_run(dir_ / "run", 5, 5);
  const json trace = {{"traceEvents",
                       {{{"ph", "M"},
                         {"name", "thread_name"},
                         {"pid", 0},
                         {"tid", 1},
                         {"args", {{"name", "train"}}}},
                        {{"ph", "M"},
                         {"name", "thread_name"},
                         {"pid", 0},
                         {"tid", 2},
                         {"args", {{"name", "comm"}}}},
                        {{"ph", "X"},
                         {"name", "step 3"},
                         {"cat", "step"},
                         {"pid", 0},
                         {"tid", 1},
                         {"ts", 1000.0},
                         {"dur", 1000.0}},
                        {{"ph", "X"},
                         {"name", "forward"},
                         {"cat", "compute"},
                         {"pid", 0},
                         {"tid", 1},
                         {"ts", 1000.0},
                         {"dur", 300.0}},
                        // nested in forward: counts once
                        {{"ph", "X"},
                         {"name", "block 0"},
                         {"cat", "compute"},
                         {"pid", 0},
                         {"tid", 1},
                         {"ts", 1100.0},
                         {"dur", 100.0}},
                        {{"ph", "X"},
                         {"name", "backward"},
                         {"cat", "compute"},
                         {"pid", 0},
                         {"tid", 1},
                         {"ts", 1300.0},
                         {"dur", 500.0}},
                        {{"ph", "X"},
                         {"name", "all_reduce"},
                         {"cat", "comm"},
                         {"pid", 0},
                         {"tid", 2},
                         {"ts", 1500.0},
                         {"dur", 200.0}},
                        // starts in step 3, ends after it: only its part inside counts
                        {{"ph", "X"},
                         {"name", "all_reduce"},
                         {"cat", "comm"},
                         {"pid", 0},
                         {"tid", 2},
                         {"ts", 1900.0},
                         {"dur", 400.0}}}}};
  write_text(run / "trace" / "rank_0.json", trace.dump());
  write_text(run / "trace" / "rank_1.json", "{\"traceEvents\": [");  // cut short
  const std::string html = render_report(run.string());
  const json traces = report_data(html)["traces"];
  ASSERT_EQ(traces.size(), 2u);
  ASSERT_EQ(traces[0]["steps"].size(), 1u);
  const json& step = traces[0]["steps"][0];
  EXPECT_EQ(step["step"], 3);
  EXPECT_DOUBLE_EQ(step["step_us"].get<double>(), 1000.0);
  EXPECT_DOUBLE_EQ(step["rows"]["train"]["compute"].get<double>(), 800.0);
  EXPECT_DOUBLE_EQ(step["rows"]["comm"]["comm"].get<double>(), 300.0);
  EXPECT_NE(traces[1]["error"].get<std::string>().find("not valid JSON"), std::string::npos);
  EXPECT_NE(html.find("Where the time went"), std::string::npos);
  EXPECT_NE(html.find("ui.perfetto.dev"), std::string::npos);
  EXPECT_NE(html.find("shardtrain trace merge RUN_DIR"), std::string::npos);
}

TEST_F(ReportTest, ScalingOnlyDirectory) {
  const json scaling = {
      {"format", 1},
      {"mode", "strong"},
      {"model", "gpt2-demo"},
      {"rows",
       {{{"strategy", "ddp"}, {"ranks", 1}, {"tokens_per_s", 9000.0}, {"efficiency", 1.0}},
        {{"strategy", "ddp"}, {"ranks", 2}, {"tokens_per_s", 16000.0}, {"efficiency", 0.89}},
        {{"strategy", "fsdp"},
         {"ranks", 2},
         {"tokens_per_s", 15000.0},
         {"trace_exposed_comm_s", 0.0125},
         {"efficiency", 0.83}}}}};
  write_text(dir_ / "scaling" / "scaling.json", scaling.dump(2));
  const std::string html = render_report((dir_ / "scaling").string());
  EXPECT_EQ(report_data(html)["scaling"], scaling);
  EXPECT_NE(html.find("<td class=\"num\">89.0 %</td>"), std::string::npos);
  EXPECT_NE(html.find("<th class=\"num\">trace_exposed_comm_s</th>"), std::string::npos);
  EXPECT_NE(html.find("<td class=\"num\">12.50 ms</td>"), std::string::npos);
  EXPECT_EQ(count(html, "data-chart=\""), 2u);
  EXPECT_EQ(html.find("Settings"), std::string::npos);
  EXPECT_EQ(describe_run((dir_ / "scaling").string()).world_size, 0);

  write_text(dir_ / "scaling" / "scaling.json", "{\"rows\": [{\"strategy\": \"ddp\"}]}");
  EXPECT_THROW(render_report((dir_ / "scaling").string()), std::invalid_argument);
}

TEST_F(ReportTest, TextFromTheRunIsEscaped) {
  const fs::path run = write_run(dir_ / "run", 2, 2);
  json named = run_json(2, 2);
  named["model"]["name"] = "</script><b>x</b>";
  write_text(run / "run.json", named.dump());
  const std::string html = render_report(run.string());
  EXPECT_EQ(html.find("</script><b>"), std::string::npos);
  EXPECT_EQ(html.find("<b>x"), std::string::npos);
  EXPECT_EQ(report_data(html)["run"]["model"]["name"], "</script><b>x</b>");
}

TEST_F(ReportTest, WriteReportReplacesOnlyItsOutput) {
  const fs::path run = write_run(dir_ / "run", 2, 2);
  const fs::path out = dir_ / "out" / "page.html";
  fs::create_directories(out.parent_path());
  write_text(out, "old");
  write_report(run.string(), out.string());
  EXPECT_EQ(read_text(out), render_report(run.string()));
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(out.parent_path())) {
    ++files;
    EXPECT_EQ(entry.path().filename(), "page.html");  // no temporary file left behind
  }
  EXPECT_EQ(files, 1u);
  EXPECT_THROW(write_report(run.string(), (dir_ / "nowhere" / "page.html").string()),
               std::invalid_argument);
  EXPECT_THROW(write_report(run.string(), out.parent_path().string()), std::invalid_argument);
}

TEST_F(ReportTest, CommandWritesThePageAndRefusesBadInput) {
  const fs::path run = write_run(dir_ / "run", 3, 3);
  auto [status, err] = run_cli({"report", run.string(), "--device", "h100"});
  ASSERT_EQ(status, 0) << err;
  const std::string html = read_text(run / "report.html");  // the default output
  // An fp32 run: H100's fp32 peak (67 TFLOP/s), not its bf16 one, on each of 2 ranks.
  EXPECT_DOUBLE_EQ(report_data(html)["mfu"]["peak_flops"].get<double>(), 2 * 67e12);
  EXPECT_NE(html.find("h100-80gb fp32"), std::string::npos);

  json bf16 = run_json(2, 3);
  bf16["precision"]["param_dtype"] = "bf16";
  write_text(dir_ / "bf16" / "run.json", bf16.dump());
  fs::copy_file(run / "metrics.jsonl", dir_ / "bf16" / "metrics.jsonl");
  std::tie(status, err) = run_cli({"report", (dir_ / "bf16").string(), "--device", "h100"});
  ASSERT_EQ(status, 0) << err;
  EXPECT_DOUBLE_EQ(
      report_data(read_text(dir_ / "bf16" / "report.html"))["mfu"]["peak_flops"].get<double>(),
      2 * 989e12);

  std::tie(status, err) =
      run_cli({"report", run.string(), "--out", (dir_ / "p.html").string(), "--peak-tflops", "2"});
  ASSERT_EQ(status, 0) << err;
  EXPECT_DOUBLE_EQ(report_data(read_text(dir_ / "p.html"))["mfu"]["peak_flops"].get<double>(),
                   4e12);

  // No peak given: this host is measured.
  std::tie(status, err) = run_cli({"report", run.string(), "--out", (dir_ / "m.html").string()});
  ASSERT_EQ(status, 0) << err;
  const json measured = report_data(read_text(dir_ / "m.html"));
  EXPECT_GT(measured["mfu"]["peak_flops"].get<double>(), 1e8);
  EXPECT_NE(measured["mfu"]["peak"].get<std::string>().find("measured now on this host"),
            std::string::npos);

  // Missing run directories of any name: refused, named.
  for (const std::string& name :
       {std::string("missing"), std::string(300, 'a'), std::string("\xe6\x97\xa5\xe6\x9c\xac")}) {
    std::tie(status, err) = run_cli({"report", (dir_ / name).string(), "--out", "x.html"});
    EXPECT_EQ(status, 2) << name;
    EXPECT_NE(err.find((dir_ / name).string()), std::string::npos) << err;
  }
  std::tie(status, err) = run_cli({"report", run.string(), "--device", "tpu-v9"});
  EXPECT_EQ(status, 2);
  EXPECT_NE(err.find("tpu-v9"), std::string::npos) << err;
  std::tie(status, err) =
      run_cli({"report", run.string(), "--device", "h100", "--peak-tflops", "1"});
  EXPECT_EQ(status, 2) << err;
  std::tie(status, err) =
      run_cli({"report", run.string(), "--out", (dir_ / "no" / "such" / "x.html").string()});
  EXPECT_EQ(status, 2) << err;
}

TEST_F(ReportTest, ReportOfATrainedRunHoldsItsMetricsAndTraces) {
  {
    std::ofstream corpus(dir_ / "corpus.txt");
    for (int i = 0; i < 200; ++i) corpus << "five boxing wizards jump quickly " << i % 7 << ".\n";
  }
  const fs::path run = dir_ / "trained";
  run_local_ranks(
      2,
      [&](ProcessGroup& group) {
        auto shared = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
        Trainer trainer(testing::tiny_run_config(
                            dir_ / "corpus.txt", run,
                            {"parallel.strategy=\"fsdp\"", "train.steps=5", "train.micro_batch=4",
                             "train.eval_every=5", "run.trace=true", "run.trace_steps=[2, 3]"}),
                        shared);
        trainer.fit();
      },
      ProcessGroupOptions().timeout(std::chrono::seconds(120)));
  auto [status, err] = run_cli({"report", run.string(), "--peak-tflops", "1"});
  ASSERT_EQ(status, 0) << err;
  const std::string html = read_text(run / "report.html");
  const json data = report_data(html);
  expect_data_equals_file(data, run / "metrics.jsonl");
  EXPECT_EQ(data["status"]["last_step"], 5);
  EXPECT_EQ(data["status"]["in_progress"], false);
  EXPECT_EQ(data["run"], json::parse(read_text(run / "run.json")));
  EXPECT_EQ(data["traces"].size(), 2u);  // both ranks' time by category
  // The communication chart: the run wrote comm times.
  EXPECT_NE(html.find("data-chart=\"comm\""), std::string::npos);
}

}  // namespace report_test
}  // namespace shardtrain
