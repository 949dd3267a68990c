// What the benchmark programs share.
#pragma once

#include <algorithm>
#include <vector>

namespace shardtrain::bench {

// The median (the mean of the two middle values for an even count); v must not be empty.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace shardtrain::bench
