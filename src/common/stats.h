// Summary statistics over measurements, shared by the planner's validation and the report.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace shardtrain::detail {

// The median of the finite-or-infinite values (NaNs are left out); NaN when none remain.
inline double median(std::vector<double> values) {
  values.erase(std::remove_if(values.begin(), values.end(), [](double v) { return std::isnan(v); }),
               values.end());
  if (values.empty()) return NAN;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

}  // namespace shardtrain::detail
