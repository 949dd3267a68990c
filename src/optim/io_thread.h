// A thread that runs submitted jobs in order; each submit returns a future for its job.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "optim/swap_file.h"
#include "trace/telemetry.h"

namespace shardtrain::detail {

class IoThread {
 public:
  IoThread() : thread_([this] { run(); }) {}
  // Finishes the jobs already queued, then joins.
  ~IoThread() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }
  IoThread(const IoThread&) = delete;
  IoThread& operator=(const IoThread&) = delete;

  // The future holds the job's exception, if it throws.
  // The job runs under the submitting thread's telemetry, so its transfers are that rank's.
  std::future<void> submit(std::function<void()> job) {
    std::packaged_task<void()> task([telemetry = current_telemetry(), job = std::move(job)] {
      TelemetryScope scope(telemetry);
      job();
    });
    auto done = task.get_future();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(task));
    }
    wake_.notify_one();
    return done;
  }

 private:
  void run() {
    for (;;) {
      std::packaged_task<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

// Waits for a submitted job (rethrowing its error), timed as the training thread's wait for
// file I/O; an empty future is no wait.
inline void wait_for_io(std::future<void>& job) {
  if (!job.valid()) return;
  IoWaitTimer waiting;
  job.get();
}

}  // namespace shardtrain::detail
