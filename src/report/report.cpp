// The report page: its sections, the data block its script draws charts from, uPlot inline.
#include "shardtrain/report.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "common/file_error.h"
#include "report/assets.h"
#include "report/html.h"
#include "report/sections.h"

namespace fs = std::filesystem;

namespace shardtrain {
namespace {

using detail::ojson;

constexpr const char* kStyle = R"(
body { font: 14px/1.45 system-ui, sans-serif; color: #222; max-width: 1200px; margin: 0 auto;
       padding: 0 16px 40px; }
h1 { font-size: 22px; margin: 18px 0 4px; }
h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; padding-bottom: 3px; }
h3 { font-size: 15px; margin: 16px 0 6px; }
h3 small { font-weight: normal; color: #777; }
table { border-collapse: collapse; margin: 6px 0 12px; }
th, td { padding: 3px 10px; border-bottom: 1px solid #eee; text-align: left; vertical-align: top; }
th { background: #f5f5f5; font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
table.kv td:first-child { color: #555; white-space: nowrap; }
table.kv thead { display: none; }
.banner { padding: 8px 12px; border-radius: 4px; margin: 8px 0; }
.banner.progress { background: #fff4d6; border: 1px solid #e8c35a; font-weight: 600; }
.banner.note { background: #f1f4f9; border: 1px solid #c9d3e3; }
.chart { margin: 10px 0 18px; min-height: 40px; }
code { background: #f3f3f3; padding: 0 3px; border-radius: 3px; }
footer { margin-top: 36px; color: #777; font-size: 12px; }
)";

// Runs first: every error and unhandled rejection of the page, and console.error, is counted in
// <body data-errors> (messages in data-error-messages), which tests read from the rendered DOM.
constexpr const char* kErrorRecorder = R"(
(function () {
  var messages = [];
  function record(message) {
    messages.push(String(message));
    document.body.setAttribute('data-errors', String(messages.length));
    document.body.setAttribute('data-error-messages', messages.join(' | '));
  }
  window.addEventListener('error', function (e) { record(e.message || 'error'); });
  window.addEventListener('unhandledrejection', function (e) {
    record('unhandled rejection: ' + (e.reason && e.reason.message ? e.reason.message : e.reason));
  });
  var consoleError = console.error;
  console.error = function () {
    record(Array.prototype.slice.call(arguments).join(' '));
    consoleError.apply(console, arguments);
  };
  window.shardtrainRecordError = record;
})();
)";

// The data block as JSON that cannot end its <script> element early: '<' only occurs inside
// JSON strings, where \u003c is the same character.
std::string script_safe_json(const ojson& value) {
  const std::string text = value.dump(-1, ' ', false, ojson::error_handler_t::replace);
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    if (c == '<') {
      out += "\\u003c";
    } else {
      out += c;
    }
  }
  return out;
}

// The page's script text inside <script>: "</script" cannot occur in it (checked, since it comes
// from a file outside this repository).
std::string inline_script(std::string_view text, const char* what) {
  std::string lower(text);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower.find("</script") != std::string::npos) {
    throw std::runtime_error(std::string("report: the embedded ") + what +
                             " contains </script and cannot be inlined");
  }
  return std::string(text);
}

ojson data_block(const detail::RunData& data, const detail::Peak& peak) {
  ojson d;
  d["format"] = 1;
  d["dir"] = data.dir;
  d["run"] = data.has_run ? data.run : ojson();
  ojson rows = ojson::array();
  for (const auto& row : data.metrics.rows) rows.push_back(ojson(row));
  d["metrics"] = {{"columns", data.metrics.columns}, {"rows", std::move(rows)}};
  d["status"] = {{"last_step", data.last_step >= 0 ? ojson(data.last_step) : ojson()},
                 {"steps_planned", data.steps_planned > 0 ? ojson(data.steps_planned) : ojson()},
                 {"in_progress", data.steps_planned > 0 && data.last_step < data.steps_planned},
                 {"steps_recorded", data.metrics.distinct_steps()},
                 {"truncated_last_line", data.metrics.truncated_last_line}};
  d["mfu"] = {{"flops_per_token", data.flops_per_token > 0 ? ojson(data.flops_per_token) : ojson()},
              {"formula", data.flops_formula},
              {"peak_flops", peak.total > 0 ? ojson(peak.total) : ojson()},
              {"peak_flops_per_rank", peak.per_rank > 0 ? ojson(peak.per_rank) : ojson()},
              {"peak", peak.description}};
  ojson traces = ojson::array();
  for (const auto& t : data.traces) {
    ojson steps = ojson::array();
    for (const auto& s : t.steps) {
      steps.push_back({{"step", s.step}, {"step_us", s.step_us}, {"rows", s.rows}});
    }
    traces.push_back({{"rank", t.rank}, {"file", t.file}, {"error", t.error}, {"steps", steps}});
  }
  d["traces"] = std::move(traces);
  d["scaling"] = data.has_scaling ? data.scaling : ojson();
  d["notes"] = data.notes;
  return d;
}

std::string title_of(const detail::RunData& data) {
  const ojson* name = detail::find_path(data.run, "model.name");
  if (data.has_run && name && name->is_string()) {
    return "shardtrain report: " + name->get<std::string>();
  }
  if (data.has_scaling && data.scaling.contains("model")) {
    return "shardtrain scaling report: " + detail::format_leaf(data.scaling["model"]);
  }
  return "shardtrain report";
}

}  // namespace

std::string render_report(const std::string& run_dir, const ReportOptions& options) {
  const detail::RunData data = detail::load_run(run_dir);
  const detail::Peak peak = detail::run_peak(data, options);
  const std::string title = detail::escape_html(title_of(data));

  std::string html = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  html += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  html += "<title>" + title + "</title>\n";
  html += "<!-- uPlot (https://github.com/leeoniya/uPlot), inlined below under its license:\n" +
          std::string(detail::uplot_license()) + "-->\n";
  html += "<style>\n" + std::string(detail::uplot_css()) + "\n" + kStyle + "</style>\n";
  html += "</head>\n<body data-errors=\"0\" data-rendered=\"0\">\n";
  html += "<script>" + std::string(kErrorRecorder) + "</script>\n";
  html += "<h1>" + title + "</h1>\n";
  html += detail::banners(data);
  html += detail::summary_section(data, peak);
  html += detail::training_section(data);
  html += detail::throughput_section(data, peak);
  html += detail::memory_section(data);
  html += detail::comm_section(data);
  html += detail::trace_section(data);
  html += detail::scaling_section(data);
  html += detail::settings_section(data);
  html +=
      "<footer>Written by <code>shardtrain report</code>. Charts: uPlot, inlined; the page "
      "needs no network.</footer>\n";
  html += "<script type=\"application/json\" id=\"report-data\">" +
          script_safe_json(data_block(data, peak)) + "</script>\n";
  html += "<script>\n" + inline_script(detail::uplot_js(), "uPlot script") + "\n</script>\n";
  html += "<script>\n" + inline_script(detail::report_js(), "report script") + "\n</script>\n";
  html += "</body>\n</html>\n";
  return html;
}

void write_report(const std::string& run_dir, const std::string& out_path,
                  const ReportOptions& options) {
  const std::string html = render_report(run_dir, options);  // bad input is reported first
  const fs::path out(out_path);
  if (fs::is_directory(out)) {
    throw std::invalid_argument("report: the output '" + out_path + "' is a directory");
  }
  const fs::path folder = out.has_parent_path() ? out.parent_path() : fs::path(".");
  if (!fs::is_directory(folder)) {
    throw std::invalid_argument("report: the folder of the output '" + out_path +
                                "' does not exist");
  }
  // A temporary name of our own (mkstemp never reuses an existing file), renamed over out_path;
  // the name is shortened so that it stays within NAME_MAX when out_path's is near it.
  std::string tmp = (folder / ("." + out.filename().string().substr(0, 200) + ".XXXXXX")).string();
  const int fd = mkstemp(tmp.data());
  if (fd < 0) {
    throw std::runtime_error("report: cannot create a file beside '" + out_path +
                             "': " + std::strerror(errno));
  }
  size_t written = 0;
  while (written < html.size()) {
    const ssize_t n = ::write(fd, html.data() + written, html.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      fs::remove(tmp);
      throw std::runtime_error("report: cannot write '" + tmp + "': " + why);
    }
    written += static_cast<size_t>(n);
  }
  fchmod(fd, 0644);  // mkstemp's 0600 would make the page private to its writer
  if (::close(fd) != 0) {
    const std::string message = "report: " + detail::cannot_write(tmp);
    fs::remove(tmp);
    throw std::runtime_error(message);
  }
  std::error_code ec;
  fs::rename(tmp, out, ec);
  if (ec) {
    fs::remove(tmp);
    throw std::runtime_error("report: cannot rename '" + tmp + "' to '" + out_path +
                             "': " + ec.message());
  }
}

}  // namespace shardtrain
