#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

#include "shardtrain/bench.h"
#include "train/memory_check.h"

namespace shardtrain {
namespace {

const std::vector<std::string> kOps = {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                       "all_to_all"};

// Fills `t` with small integers that depend on the rank and the index, so sums stay exact in
// every dtype the benchmark runs (values stay below 256 x world size).
at::Tensor pattern(int64_t numel, int rank, at::ScalarType dtype) {
  return (at::arange(numel, at::kLong).remainder(7) + rank + 1).to(dtype);
}

// all_to_all sends `full` in equal parts, one to each rank, and receives into `received`.
WorkHandle run_once(ProcessGroup& group, const std::string& op, at::Tensor& full, at::Tensor& shard,
                    at::Tensor& received) {
  if (op == "all_to_all") return group.all_to_all(full, received, {}, {});
  if (op == "all_reduce") return group.all_reduce(full);
  if (op == "all_gather") return group.all_gather(shard, full);
  if (op == "reduce_scatter") return group.reduce_scatter(full, shard);
  return group.broadcast(full, 0);
}

bool values_ok(const std::string& op, const at::Tensor& full, const at::Tensor& shard,
               const at::Tensor& received, int n, int rank, at::ScalarType dtype) {
  const int64_t count = full.numel();
  const auto base = at::arange(count, at::kLong).remainder(7);
  const ShardRange mine = shard_range(count, n, rank);
  if (op == "all_to_all") {
    // Part `rank` of every rank's pattern, in rank order.
    const int64_t part = count / n;
    auto expected = at::empty({count}, at::kLong);
    for (int r = 0; r < n; ++r) {
      expected.narrow(0, r * part, part)
          .copy_(pattern(count, r, at::kLong).narrow(0, rank * part, part));
    }
    return at::equal(received.to(at::kLong), expected);
  }
  if (op == "all_reduce") {
    // Each iteration re-reduces the previous result, so compare against one reduction of the
    // pattern only when the benchmark reset it before the checked run.
    return at::equal(full.to(at::kLong), base * n + n * (n + 1) / 2);
  }
  if (op == "reduce_scatter") {
    return at::equal(shard.to(at::kLong),
                     (base * n + n * (n + 1) / 2).narrow(0, mine.offset, mine.numel));
  }
  if (op == "all_gather") {
    auto expected = at::empty({count}, at::kLong);
    for (int r = 0; r < n; ++r) {
      const ShardRange s = shard_range(count, n, r);
      expected.narrow(0, s.offset, s.numel)
          .copy_(pattern(count, r, at::kLong).narrow(0, s.offset, s.numel));
    }
    return at::equal(full.to(at::kLong), expected);
  }
  return at::equal(full, pattern(count, 0, dtype));
}

}  // namespace

double bus_bandwidth_factor(const std::string& op, int n) {
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "all_gather" || op == "reduce_scatter" || op == "all_to_all") {
    return static_cast<double>(n - 1) / n;
  }
  return 1.0;
}

std::vector<CollectiveBenchRow> bench_collectives(ProcessGroup& group,
                                                  const CollectiveBenchOptions& o) {
  for (const auto& op : o.ops_) {
    if (std::find(kOps.begin(), kOps.end(), op) == kOps.end()) {
      throw std::invalid_argument("unknown collective '" + op +
                                  "' (expected all_reduce, all_gather, reduce_scatter, "
                                  "broadcast or all_to_all)");
    }
  }
  if (o.min_bytes_ < 1 || o.max_bytes_ < o.min_bytes_) {
    throw std::invalid_argument("sizes must satisfy 1 <= min bytes <= max bytes");
  }
  if (o.step_factor_ < 2) throw std::invalid_argument("the size step factor must be >= 2");
  if (o.iters_ < 1 || o.warmup_ < 0) {
    throw std::invalid_argument("iters must be >= 1 and warmup >= 0");
  }
  const int n = group.size();
  const int rank = group.rank();
  const int64_t element = at::elementSize(o.dtype_);
  // Refused before anything is allocated: a rank holds the array, the pattern it is made from
  // and, for all_to_all, what it receives, three times the largest size, and so does every rank
  // on this host.
  int64_t largest = o.min_bytes_;
  while (largest <= o.max_bytes_ / o.step_factor_) largest *= o.step_factor_;
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  const int64_t here = local != nullptr && std::atoi(local) > 0 ? std::atoi(local) : n;
  detail::require_host_memory(
      3.0 * static_cast<double>(largest) * static_cast<double>(here),
      "bench collectives: the largest array, " + std::to_string(largest) + " bytes,",
      "3 times the size on each of this host's " + std::to_string(here) + " ranks");
  std::vector<CollectiveBenchRow> rows;
  for (const auto& op : o.ops_) {
    for (int64_t bytes = o.min_bytes_; bytes <= o.max_bytes_; bytes *= o.step_factor_) {
      int64_t count = std::max<int64_t>(1, bytes / element);
      // all_to_all sends every rank an equal part: a whole number of elements each.
      if (op == "all_to_all") count = std::max<int64_t>(n, count / n * n);
      const ShardRange mine = shard_range(count, n, rank);
      at::Tensor full = pattern(count, rank, o.dtype_);
      at::Tensor shard = pattern(count, rank, o.dtype_).narrow(0, mine.offset, mine.numel).clone();
      at::Tensor received = op == "all_to_all" ? at::empty_like(full) : at::Tensor();
      for (int i = 0; i < o.warmup_; ++i) run_once(group, op, full, shard, received)->wait();
      group.barrier()->wait();
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < o.iters_; ++i) run_once(group, op, full, shard, received)->wait();
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      // The slowest rank's time is the operation's time.
      auto slowest = at::full({1}, seconds / o.iters_, at::kDouble);
      group.all_reduce(slowest, ReduceOp::kMax)->wait();

      CollectiveBenchRow row;
      row.op = op;
      row.count = count;
      row.bytes = count * element;
      row.time_us = slowest.item<double>() * 1e6;
      row.algbw_gbps = row.bytes / (row.time_us * 1e-6) / 1e9;
      row.busbw_gbps = row.algbw_gbps * bus_bandwidth_factor(op, n);
      if (o.check_) {
        full = pattern(count, rank, o.dtype_);
        shard = pattern(count, rank, o.dtype_).narrow(0, mine.offset, mine.numel).clone();
        run_once(group, op, full, shard, received)->wait();
        auto ok = at::full({1}, values_ok(op, full, shard, received, n, rank, o.dtype_) ? 0 : 1,
                           at::kInt);
        group.all_reduce(ok, ReduceOp::kMax)->wait();
        row.values_ok = ok.item<int>() == 0;
      }
      rows.push_back(row);
    }
  }
  return rows;
}

std::string format_bench_table(const std::vector<CollectiveBenchRow>& rows, int world_size) {
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof(line), "# %d ranks\n#%15s %12s %14s %12s %10s %10s %6s\n", world_size,
                "op", "size(B)", "count(elems)", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "check");
  out << line;
  for (const auto& r : rows) {
    std::snprintf(line, sizeof(line), "%16s %12lld %14lld %12.1f %10.3f %10.3f %6s\n", r.op.c_str(),
                  static_cast<long long>(r.bytes), static_cast<long long>(r.count), r.time_us,
                  r.algbw_gbps, r.busbw_gbps, r.values_ok ? "ok" : "WRONG");
    out << line;
  }
  return out.str();
}

}  // namespace shardtrain
