// Work handles completed by whoever runs the operation (a worker thread, a transport wait).
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>

#include "shardtrain/dist.h"

namespace shardtrain::detail {

// A handle that another thread completes with finish(). wait() rethrows the stored error.
class CompletionWork : public Work {
 public:
  // `op` (a string literal: it is kept as a pointer) names the operation in traces of the time
  // spent waiting for it.
  explicit CompletionWork(const char* op = "communication") : op_(op) {}
  void wait() override;
  bool is_completed() override;
  std::chrono::steady_clock::time_point finished_at() override;
  std::chrono::steady_clock::time_point started_at() override;
  // Records that the operation begins running now.
  void start();
  // Marks the operation done; `error` (may be null) is what wait() rethrows.
  void finish(std::exception_ptr error = nullptr);

 private:
  const char* op_;
  std::chrono::steady_clock::time_point started_at_;
  std::chrono::steady_clock::time_point finished_at_;
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

// A handle for an operation that finished before it was returned.
class CompletedWork : public Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};

}  // namespace shardtrain::detail
