// A file that holds tensor data in place of memory (NVMe offload): created fresh, sized up front,
// read and written at offsets, removed when the object goes.
#pragma once

#include <cstdint>
#include <string>

#include "trace/telemetry.h"

namespace shardtrain::detail {

// Bytes every swap file of this process has read and written, and the seconds spent in those
// transfers (summed over the threads doing them), since the process started. `wait_seconds`
// is the part of it the training thread spent blocked: in its own transfers, or waiting for
// the I/O threads' (IoWaitTimer).
struct SwapIoTotals {
  int64_t read_bytes = 0;
  int64_t written_bytes = 0;
  double seconds = 0;
  double wait_seconds = 0;
};
SwapIoTotals swap_io_totals();

// Adds its lifetime to swap_io_totals().wait_seconds: put one around each place the training
// thread waits for a transfer.
class IoWaitTimer {
 public:
  IoWaitTimer();
  ~IoWaitTimer();
  IoWaitTimer(const IoWaitTimer&) = delete;
  IoWaitTimer& operator=(const IoWaitTimer&) = delete;

 private:
  int64_t start_ns_;
  TraceSpan span_;  // the wait, in a trace
};

// A name under `dir` no other live swap file has: dir/shardtrain_<what>_<pid>_<n>.
std::string unique_swap_stem(const std::string& dir, const std::string& what);

class SwapFile {
 public:
  // Creates `path`, which must not exist, as `bytes` of zeros (a file of holes, so nothing is
  // written). With `direct` the file is opened O_DIRECT: transfers then need 4 KiB-aligned
  // buffers, sizes and offsets. Throws std::invalid_argument naming the file and the system's
  // reason when it cannot be created.
  SwapFile(std::string path, int64_t bytes, bool direct = false);
  ~SwapFile();  // closes and removes the file
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;

  // Whole transfers (retried on EINTR); a failure throws std::runtime_error naming the file.
  void read(void* out, int64_t bytes, int64_t offset) const;
  void write(const void* in, int64_t bytes, int64_t offset) const;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace shardtrain::detail
