// Number formatting shared by the planner's messages and reports.
#pragma once

#include <cstdio>
#include <string>

namespace shardtrain::detail {

// printf into a std::string.
template <typename... Args>
std::string format(const char* fmt, Args... args) {
  char buffer[256];
  std::snprintf(buffer, sizeof(buffer), fmt, args...);
  return buffer;
}

// Bytes as decimal gigabytes (1e9), the unit of the ZeRO paper and DeepSpeed's estimator.
inline std::string gb(double bytes) { return format("%.1f GB", bytes / 1e9); }

}  // namespace shardtrain::detail
