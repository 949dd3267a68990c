// Exact accounting of the bytes LibTorch holds in CPU tensors: live now, and the peak since the
// last reset. Resident memory (RSS) says less: allocators keep freed pages, so it neither falls
// when tensors die nor rises when a freed block is reused.
#pragma once

#include <cstdint>

namespace shardtrain {

struct CpuMemoryStats {
  int64_t live_bytes = 0;  // in CPU tensors allocated since tracking was installed
  int64_t peak_bytes = 0;  // highest live_bytes since the last reset_peak_cpu_memory()
};

// Puts a counting wrapper in front of LibTorch's default CPU allocator (once per process; later
// calls do nothing). Tensors allocated before it are not counted. Thread-safe.
void install_cpu_memory_tracking();
CpuMemoryStats cpu_memory_stats();
// Restarts the peak at the current live bytes.
void reset_peak_cpu_memory();

}  // namespace shardtrain
