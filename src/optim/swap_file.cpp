#include "optim/swap_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace shardtrain::detail {
namespace {

std::string system_error(const std::string& what, const std::string& path) {
  return "NVMe offload: " + what + " '" + path + "': " + std::strerror(errno);
}

std::atomic<int64_t> read_bytes{0}, written_bytes{0}, io_nanoseconds{0}, wait_nanoseconds{0};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void transfer(bool write, int fd, const std::string& path, char* buffer, int64_t bytes,
              int64_t offset) {
  (write ? written_bytes : read_bytes) += bytes;
  TraceSpan span(write ? "file write" : "file read", "offload", {{"bytes", bytes}});
  struct Timed {
    int64_t start = now_ns();
    ~Timed() { io_nanoseconds += now_ns() - start; }
  } timed;
  while (bytes > 0) {
    const ssize_t done =
        write ? ::pwrite(fd, buffer, bytes, offset) : ::pread(fd, buffer, bytes, offset);
    if (done < 0 && errno == EINTR) continue;
    if (done < 0)
      throw std::runtime_error(system_error(write ? "cannot write" : "cannot read", path));
    if (done == 0) {
      throw std::runtime_error("NVMe offload: '" + path + "' ended early (at byte " +
                               std::to_string(offset) + "); was it truncated?");
    }
    buffer += done;
    bytes -= done;
    offset += done;
  }
}

}  // namespace

SwapIoTotals swap_io_totals() {
  return {read_bytes.load(), written_bytes.load(),
          static_cast<double>(io_nanoseconds.load()) * 1e-9,
          static_cast<double>(wait_nanoseconds.load()) * 1e-9};
}

IoWaitTimer::IoWaitTimer() : start_ns_(now_ns()), span_("wait for files", "wait") {}
IoWaitTimer::~IoWaitTimer() { wait_nanoseconds += now_ns() - start_ns_; }

std::string unique_swap_stem(const std::string& dir, const std::string& what) {
  static std::atomic<int64_t> counter{0};
  return (std::filesystem::path(dir) /
          ("shardtrain_" + what + "_" + std::to_string(getpid()) + "_" + std::to_string(counter++)))
      .string();
}

SwapFile::SwapFile(std::string path, int64_t bytes, bool direct) : path_(std::move(path)) {
  int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
  if (direct) flags |= O_DIRECT;
  fd_ = ::open(path_.c_str(), flags, 0600);
  if (fd_ < 0) {
    const bool no_direct = direct && errno == EINVAL;
    throw std::invalid_argument(system_error("cannot create", path_) +
                                (no_direct ? " (O_DIRECT unsupported there)" : ""));
  }
  if (::ftruncate(fd_, bytes) != 0) {
    const std::string reason = system_error("cannot size", path_);
    ::close(fd_);
    ::unlink(path_.c_str());
    throw std::invalid_argument(reason);
  }
}

SwapFile::~SwapFile() {
  ::close(fd_);
  ::unlink(path_.c_str());
}

void SwapFile::read(void* out, int64_t bytes, int64_t offset) const {
  transfer(false, fd_, path_, static_cast<char*>(out), bytes, offset);
}

void SwapFile::write(const void* in, int64_t bytes, int64_t offset) const {
  // pwrite does not modify the buffer; transfer takes one pointer type for both directions.
  transfer(true, fd_, path_, static_cast<char*>(const_cast<void*>(in)), bytes, offset);
}

}  // namespace shardtrain::detail
