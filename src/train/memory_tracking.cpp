#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "shardtrain/memory.h"

namespace shardtrain {
namespace {

// Sizes of the blocks handed out, by address: the deleter only receives the pointer. Keeping
// data pointer == context (as LibTorch's own CPU allocator does) lets raw_allocate work too.
struct Ledger {
  std::mutex mutex;
  std::unordered_map<void*, size_t> sizes;
  std::atomic<int64_t> live{0};
  std::atomic<int64_t> peak{0};
  c10::Allocator* inner = nullptr;
  c10::DeleterFnPtr inner_free = nullptr;
};

Ledger& ledger() {
  static Ledger* instance = new Ledger();  // never destroyed: tensors may die at exit
  return *instance;
}

void tracked_free(void* ptr) {
  Ledger& l = ledger();
  size_t size = 0;
  {
    std::lock_guard<std::mutex> lock(l.mutex);
    auto it = l.sizes.find(ptr);
    if (it != l.sizes.end()) {
      size = it->second;
      l.sizes.erase(it);
    }
  }
  l.live -= static_cast<int64_t>(size);
  l.inner_free(ptr);
}

class CountingAllocator : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) const override {
    Ledger& l = ledger();
    c10::DataPtr inner = l.inner->allocate(bytes);
    void* ptr = inner.get();
    if (!ptr || inner.get_context() != ptr) return inner;  // not a plain block: leave it be
    inner.release_context();
    {
      std::lock_guard<std::mutex> lock(l.mutex);
      l.sizes[ptr] = bytes;
    }
    const int64_t now = (l.live += static_cast<int64_t>(bytes));
    for (int64_t seen = l.peak.load(); now > seen && !l.peak.compare_exchange_weak(seen, now);) {
    }
    return c10::DataPtr(ptr, ptr, &tracked_free, c10::Device(c10::DeviceType::CPU));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &tracked_free; }
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif
};

}  // namespace

void install_cpu_memory_tracking() {
  static std::once_flag once;
  std::call_once(once, [] {
    Ledger& l = ledger();
    l.inner = c10::GetDefaultCPUAllocator();
    l.inner_free = l.inner->raw_deleter();
    if (!l.inner_free) return;  // cannot free through it: leave the allocator alone
    static CountingAllocator allocator;
    // Priority above the default (0) so GetCPUAllocator() returns the wrapper.
    c10::SetCPUAllocator(&allocator, /*priority=*/1);
  });
}

CpuMemoryStats cpu_memory_stats() {
  return CpuMemoryStats{ledger().live.load(), ledger().peak.load()};
}

void reset_peak_cpu_memory() { ledger().peak.store(ledger().live.load()); }

}  // namespace shardtrain
