// Benchmarks of the communication layer, reported in nccl-tests' units.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/dist.h"

namespace shardtrain {

struct CollectiveBenchOptions {
  // all_reduce, all_gather, reduce_scatter, broadcast, all_to_all (equal parts to every rank).
  CollectiveBenchOptions& ops(std::vector<std::string> value) {
    ops_ = std::move(value);
    return *this;
  }
  CollectiveBenchOptions& min_bytes(int64_t value) {
    min_bytes_ = value;
    return *this;
  }
  CollectiveBenchOptions& max_bytes(int64_t value) {
    max_bytes_ = value;
    return *this;
  }
  CollectiveBenchOptions& step_factor(int value) {
    step_factor_ = value;
    return *this;
  }
  CollectiveBenchOptions& iters(int value) {
    iters_ = value;
    return *this;
  }
  CollectiveBenchOptions& warmup(int value) {
    warmup_ = value;
    return *this;
  }
  CollectiveBenchOptions& dtype(at::ScalarType value) {
    dtype_ = value;
    return *this;
  }
  CollectiveBenchOptions& check(bool value) {
    check_ = value;
    return *this;
  }

  std::vector<std::string> ops_{"all_reduce"};
  int64_t min_bytes_ = 1024;
  int64_t max_bytes_ = 64ll << 20;
  int step_factor_ = 2;
  int iters_ = 20;
  int warmup_ = 5;
  at::ScalarType dtype_ = at::kFloat;
  bool check_ = true;  // verify the values of the last iteration of each size
};

struct CollectiveBenchRow {
  std::string op;
  int64_t bytes = 0;      // size of the full array (nccl-tests' "size")
  int64_t count = 0;      // elements of the full array
  double time_us = 0;     // mean time per operation, slowest rank
  double algbw_gbps = 0;  // bytes / time
  double busbw_gbps = 0;  // algbw x 2(n-1)/n for all_reduce, (n-1)/n for all/reduce-scatter
  bool values_ok = true;
};

// Collective over `group`: every member calls it with the same options; every member gets the
// same rows. Throws std::invalid_argument naming a bad option (unknown op, sizes).
std::vector<CollectiveBenchRow> bench_collectives(ProcessGroup& group,
                                                  const CollectiveBenchOptions& options);

// nccl-tests' busbw factor for `op` on n ranks.
double bus_bandwidth_factor(const std::string& op, int n);

// The rows as an aligned text table with a header line.
std::string format_bench_table(const std::vector<CollectiveBenchRow>& rows, int world_size);

}  // namespace shardtrain
