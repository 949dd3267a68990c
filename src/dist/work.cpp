#include "dist/work.h"

namespace shardtrain::detail {

void CompletionWork::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [this] { return done_; });
  if (error_) std::rethrow_exception(error_);
}

bool CompletionWork::is_completed() {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

void CompletionWork::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
    error_ = std::move(error);
  }
  done_cv_.notify_all();
}

}  // namespace shardtrain::detail
