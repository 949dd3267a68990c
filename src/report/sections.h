// The report page's sections, each a piece of HTML: tables written here, charts as placeholders
// (<div class="chart" data-chart="NAME">) that the page's script (report.js) draws into.
#pragma once

#include <string>
#include <vector>

#include "report/run_data.h"
#include "shardtrain/report.h"

namespace shardtrain::detail {

// The peak MFU divides by, for the whole run.
struct Peak {
  double total = 0;     // FLOP/s of all ranks together; 0: no MFU
  double per_rank = 0;  // 0 when the ranks shared one peak
  std::string source;
  std::string description;  // "989 TFLOP/s per rank × 2 ranks = ..." with its source
};
Peak run_peak(const RunData& data, const ReportOptions& options);

// Index of the first (lowest-rank) row of each step: the rows global values are read from.
std::vector<size_t> first_row_per_step(const MetricsTable& table);

std::string banners(const RunData& data);
std::string summary_section(const RunData& data, const Peak& peak);
std::string training_section(const RunData& data);
std::string throughput_section(const RunData& data, const Peak& peak);
std::string memory_section(const RunData& data);
std::string comm_section(const RunData& data);
std::string trace_section(const RunData& data);
std::string scaling_section(const RunData& data);
std::string settings_section(const RunData& data);

}  // namespace shardtrain::detail
