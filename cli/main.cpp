// shardtrain <subcommand>: parses arguments into option structs and calls the library.
#include <c10/util/Logging.h>
#include <malloc.h>

#include <cstdlib>
#include <iostream>

#include "app.h"

int main(int argc, char** argv) {
  // LibTorch's own log lines (c10d's connection retries, glog's "Logging before
  // InitGoogleLogging") repeat what shardtrain's messages say; TORCH_CPP_LOG_LEVEL (INFO,
  // WARNING, ERROR) shows them, as it does for PyTorch. glog writes to stderr, never to files.
  const bool quiet = std::getenv("TORCH_CPP_LOG_LEVEL") == nullptr;
  if (quiet) FLAGS_caffe2_log_level = 3;  // FATAL
  c10::initLogging();
#ifdef C10_USE_GLOG
  FLAGS_logtostderr = true;
  if (quiet) FLAGS_minloglevel = google::GLOG_FATAL;
  if (!google::IsGoogleLoggingInitialized()) google::InitGoogleLogging(argv[0]);
#endif
  // Tensors' large blocks go through shardtrain's allocator (shardtrain/memory.h), which keeps
  // them. What glibc serves (small tensors, everything else) is kept in its heap too rather than
  // mapped and unmapped: the demo then faults a third fewer pages in (bench/results/memory.md).
  // A user's own MALLOC_* settings win.
  if (!std::getenv("MALLOC_MMAP_MAX_") && !std::getenv("MALLOC_TRIM_THRESHOLD_")) {
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }
  return shardtrain::cli::run(std::vector<std::string>(argv + 1, argv + argc), std::cout,
                              std::cerr);
}
