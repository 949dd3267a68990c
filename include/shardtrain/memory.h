// LibTorch's CPU tensors through shardtrain's allocator: exact accounting of the bytes they hold
// (live now, and the peak since the last reset), and a cache of large freed blocks.
//
// Training allocates and frees the same large blocks (activations, gathered units, chunks of
// the logits) every step. A C library's malloc either keeps them in a heap that grows with every
// order the sizes arrive in, or hands them back to the kernel, which zeroes and faults each page
// in again on the next step. This allocator maps large blocks itself and keeps them when freed:
// a tensor takes a kept block of its size; failing that, a new mapping while large blocks in
// tensors and kept stay within the most ever in tensors at once; past that, a block made of kept
// blocks' pages, moved (mremap) rather than faulted in. Resident memory then follows the peak of
// live bytes, and a steady step finds its pages already there.
#pragma once

#include <cstdint>

namespace shardtrain {

struct CpuMemoryStats {
  int64_t live_bytes = 0;    // in CPU tensors allocated since the allocator was installed
  int64_t peak_bytes = 0;    // highest live_bytes since the last reset_peak_cpu_memory()
  int64_t cached_bytes = 0;  // large freed blocks kept for reuse (mapped, maybe resident)
  // What large blocks in tensors and kept together may reach before kept blocks' pages are
  // reused for other sizes: the most large-block bytes ever in tensors at once.
  int64_t cache_limit_bytes = 0;
};

// Puts shardtrain's allocator in front of LibTorch's default CPU allocator (once per process;
// later calls do nothing). Blocks of at least large_cpu_block_bytes() are mapped from the kernel
// directly and cached when freed; smaller ones go to the default allocator. Tensors allocated
// before it are neither counted nor cached. Thread-safe.
void install_cpu_memory_tracking();
CpuMemoryStats cpu_memory_stats();
// Restarts the peak at the current live bytes.
void reset_peak_cpu_memory();

// What happens to large blocks: kCache (the default) keeps them as above; kReturn maps blocks
// from 4 MiB (smaller ones go to the default allocator, as under glibc's mmap threshold) and
// unmaps them when freed, as a run whose state lives in files wants (memory is its point, not
// the page faults of the next step); kMalloc leaves them to LibTorch's default allocator (the C
// library's malloc), as small ones. Leaving kCache returns what is kept. Thread-safe; applies
// to blocks allocated (kMalloc) or freed (kCache, kReturn) afterwards.
enum class FreedMemory { kCache, kReturn, kMalloc };
void set_freed_memory(FreedMemory policy);
// The size from which a block is mapped directly and can be cached.
int64_t large_cpu_block_bytes();

}  // namespace shardtrain
