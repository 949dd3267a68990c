#include "comm/work.h"

#include "trace/telemetry.h"

namespace shardtrain::detail {

void CompletionWork::wait() {
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (done_) {
      error = error_;
    } else {
      // Communication the caller could not hide behind its own work; recorded after the lock
      // is released, so that the worker finishing the next operation never waits on it.
      const auto start = std::chrono::steady_clock::now();
      done_cv_.wait(lock, [this] { return done_; });
      error = error_;
      lock.unlock();
      record_comm_wait(op_, start, std::chrono::steady_clock::now());
    }
  }
  if (error) std::rethrow_exception(error);
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
