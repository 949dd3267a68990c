#include "comm/work.h"

#include "trace/telemetry.h"

namespace shardtrain::detail {

void CompletionWork::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!done_) {
    // Communication the caller could not hide behind its own work.
    CommWaitTimer waiting(op_);
    done_cv_.wait(lock, [this] { return done_; });
  }
  if (error_) std::rethrow_exception(error_);
}

bool CompletionWork::is_completed() {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

std::chrono::steady_clock::time_point CompletionWork::finished_at() {
  std::lock_guard<std::mutex> lock(mutex_);
  return finished_at_;
}

std::chrono::steady_clock::time_point CompletionWork::started_at() {
  std::lock_guard<std::mutex> lock(mutex_);
  return started_at_;
}

void CompletionWork::start() {
  std::lock_guard<std::mutex> lock(mutex_);
  started_at_ = std::chrono::steady_clock::now();
}

void CompletionWork::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finished_at_ = std::chrono::steady_clock::now();
    done_ = true;
    error_ = std::move(error);
  }
  done_cv_.notify_all();
}

}  // namespace shardtrain::detail
