// shardtrain's CPU allocator (shardtrain/memory.h): counts every block LibTorch allocates, maps
// large ones from the kernel itself, and keeps those when they are freed for the next tensor of
// their size, within a bound on what is mapped.
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <sys/mman.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "shardtrain/memory.h"

namespace shardtrain {
namespace {

constexpr size_t kLargeBlock = size_t{1} << 20;
// Returning memory maps blocks from 4 MiB only, as glibc does then (apply_freed_memory,
// run_setup.cpp): unmapping every block of 1-4 MiB and faulting it in again took a ZeRO-3 run
// with its state in files from 5.3 to 6.3 s a step (bench/memory.sh's zero3_nvme, 2 ranks).
constexpr size_t kReturnedBlock = size_t{4} << 20;
constexpr size_t kPage = 4096;

// Large blocks are mapped in sizes of at most 1/8 of their power of two, so that a tensor finds
// a kept block when its size differs a little from the last step's (a shorter last batch, a
// chunk of the logits), for at most 12.5% of mapping never touched.
size_t size_class(size_t bytes) {
  const size_t top = size_t{1} << (63 - __builtin_clzll(bytes));
  const size_t step = std::max(top / 8, kPage);
  return (bytes + step - 1) / step * step;
}

struct Block {
  size_t bytes = 0;   // what the tensor asked for
  size_t mapped = 0;  // the mapping's size; 0 when the default allocator holds it
};

struct Kept {
  char* ptr;
  size_t size;
  uint64_t freed_at;
};

// Sizes of the blocks handed out, by address: the deleter only receives the pointer. Keeping
// data pointer == context (as LibTorch's own CPU allocator does) lets raw_allocate work too.
struct Ledger {
  std::mutex mutex;
  std::unordered_map<void*, Block> blocks;
  std::vector<Kept> kept;
  size_t kept_bytes = 0;
  size_t mapped_live = 0;       // mapped bytes in tensors now
  size_t mapped_live_peak = 0;  // the most there ever were
  uint64_t frees = 0;
  std::atomic<FreedMemory> policy{FreedMemory::kCache};
  std::atomic<int64_t> live{0};
  std::atomic<int64_t> peak{0};
  std::atomic<int64_t> cached{0};
  std::atomic<int64_t> limit{0};
  c10::Allocator* inner = nullptr;
  c10::DeleterFnPtr inner_free = nullptr;

  // What may be mapped at once, in tensors and kept: the most there ever were in tensors. A
  // request past it is made of kept blocks' pages instead of new ones.
  size_t bound() const { return mapped_live_peak; }
  void publish() {
    cached.store(static_cast<int64_t>(kept_bytes));
    limit.store(static_cast<int64_t>(bound()));
  }
};

Ledger& ledger() {
  static Ledger* instance = new Ledger();  // never destroyed: tensors may die at exit
  return *instance;
}

void unmap(const std::vector<Kept>& blocks) {
  for (const Kept& block : blocks) munmap(block.ptr, block.size);
}

// Under the lock: every kept block, to be unmapped outside it.
std::vector<Kept> take_all_kept(Ledger& l) {
  std::vector<Kept> all;
  all.swap(l.kept);
  l.kept_bytes = 0;
  l.publish();
  return all;
}

Kept remove_kept(Ledger& l, std::vector<Kept>::iterator it) {
  const Kept taken = *it;
  l.kept_bytes -= taken.size;
  *it = l.kept.back();
  l.kept.pop_back();
  return taken;
}

// Under the lock: the kept block of this size freed last (its pages are the likeliest to be in
// cache), or nullptr.
void* take_kept(Ledger& l, size_t size) {
  auto best = l.kept.end();
  for (auto it = l.kept.begin(); it != l.kept.end(); ++it) {
    if (it->size == size && (best == l.kept.end() || it->freed_at > best->freed_at)) best = it;
  }
  return best == l.kept.end() ? nullptr : remove_kept(l, best).ptr;
}

// Under the lock: kept blocks whose pages will make up a block of `size` bytes: the smallest
// one at least as large, else the largest ones until they cover it (or all there are).
std::vector<Kept> take_pieces(Ledger& l, size_t size) {
  auto fit = l.kept.end();
  for (auto it = l.kept.begin(); it != l.kept.end(); ++it) {
    if (it->size >= size && (fit == l.kept.end() || it->size < fit->size)) fit = it;
  }
  if (fit != l.kept.end()) return {remove_kept(l, fit)};
  std::vector<Kept> pieces;
  for (size_t covered = 0; covered < size && !l.kept.empty();) {
    auto largest = std::max_element(l.kept.begin(), l.kept.end(),
                                    [](const Kept& a, const Kept& b) { return a.size < b.size; });
    pieces.push_back(remove_kept(l, largest));
    covered += pieces.back().size;
  }
  return pieces;
}

void* fresh_mapping(size_t size) {
  return mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
}

// Moves the pages of [from, from + bytes) to `to` without copying or faulting them in again.
// mremap moves within one mapping only, and a block made of others' pages spans several: a
// range it refuses is moved in halves. What cannot move at all is unmapped, and the target
// keeps zero pages there.
void move_pages(char* from, size_t bytes, char* to) {
  if (mremap(from, bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED, to) != MAP_FAILED) return;
  if (bytes <= kPage) {
    munmap(from, bytes);
    return;
  }
  const size_t half = bytes / 2 / kPage * kPage;
  move_pages(from, half, to);
  move_pages(from + half, bytes - half, to + half);
}

// A block of `size` bytes made of the pieces' pages: the smallest piece at least as large is
// cut, or the pieces are moved one after another into a new mapping. What is left of a piece is
// returned in `rest`; a tail no piece covers is zero pages, faulted in when touched. nullptr
// (the pieces unmapped) when no mapping can be had.
char* assemble(const std::vector<Kept>& pieces, size_t size, std::vector<Kept>& rest) {
  const Kept& first = pieces.front();
  if (first.size >= size) {
    if (first.size > size) rest.push_back(Kept{first.ptr + size, first.size - size, 0});
    return first.ptr;
  }
  void* target = fresh_mapping(size);
  if (target == MAP_FAILED) {
    unmap(pieces);
    return nullptr;
  }
  char* base = static_cast<char*>(target);
  size_t offset = 0;
  for (const Kept& piece : pieces) {
    const size_t moved = std::min(piece.size, size - offset);
    move_pages(piece.ptr, moved, base + offset);
    if (piece.size > moved) rest.push_back(Kept{piece.ptr + moved, piece.size - moved, 0});
    offset += moved;
  }
  return base;
}

// A block of `size` bytes: a kept one of that size; else a fresh mapping while what is mapped
// stays under the bound; else one made of kept blocks' pages, so that what a step frees in
// some sizes serves the next step's tensors of others without the kernel zeroing and faulting
// their pages in again.
char* map_large(size_t size) {
  Ledger& l = ledger();
  std::vector<Kept> pieces;
  {
    std::lock_guard<std::mutex> lock(l.mutex);
    if (void* ptr = take_kept(l, size)) return static_cast<char*>(ptr);
    if (l.mapped_live + l.kept_bytes + size > l.bound()) pieces = take_pieces(l, size);
  }
  char* ptr = nullptr;
  if (!pieces.empty()) {
    std::vector<Kept> rest;
    ptr = assemble(pieces, size, rest);
    std::vector<Kept> small;
    {
      std::lock_guard<std::mutex> lock(l.mutex);
      for (Kept& piece : rest) {
        if (piece.size < kLargeBlock) {
          small.push_back(piece);  // too small to serve a large block alone
          continue;
        }
        piece.freed_at = ++l.frees;
        l.kept.push_back(piece);
        l.kept_bytes += piece.size;
      }
    }
    unmap(small);
  }
  if (!ptr) {
    void* fresh = fresh_mapping(size);
    if (fresh == MAP_FAILED) {
      std::vector<Kept> released;
      {
        std::lock_guard<std::mutex> lock(l.mutex);  // everything kept goes before giving up
        released = take_all_kept(l);
      }
      unmap(released);
      fresh = fresh_mapping(size);
    }
    TORCH_CHECK(fresh != MAP_FAILED, "CPU allocator: could not map ", size,
                " bytes for a tensor: ", std::strerror(errno));
    ptr = static_cast<char*>(fresh);
  }
  return ptr;
}

void tracked_free(void* ptr) {
  Ledger& l = ledger();
  Block block;
  bool unmap_now = false;
  {
    std::lock_guard<std::mutex> lock(l.mutex);
    auto it = l.blocks.find(ptr);
    if (it != l.blocks.end()) {
      block = it->second;
      l.blocks.erase(it);
    }
    if (block.mapped > 0) {
      l.mapped_live -= block.mapped;
      if (l.policy == FreedMemory::kCache) {
        l.kept.push_back(Kept{static_cast<char*>(ptr), block.mapped, ++l.frees});
        l.kept_bytes += block.mapped;
        l.publish();
      } else {
        unmap_now = true;
      }
    }
  }
  l.live -= static_cast<int64_t>(block.bytes);
  if (block.mapped == 0) {
    l.inner_free(ptr);
  } else if (unmap_now) {
    munmap(ptr, block.mapped);
  }
}

void count(Ledger& l, void* ptr, Block block) {
  {
    std::lock_guard<std::mutex> lock(l.mutex);
    l.blocks[ptr] = block;
    if (block.mapped > 0) {
      l.mapped_live += block.mapped;
      l.mapped_live_peak = std::max(l.mapped_live_peak, l.mapped_live);
      l.publish();
    }
  }
  const int64_t now = (l.live += static_cast<int64_t>(block.bytes));
  for (int64_t seen = l.peak.load(); now > seen && !l.peak.compare_exchange_weak(seen, now);) {
  }
}

// LibTorch 2.3 made c10::Allocator::allocate non-const.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define SHARDTRAIN_ALLOCATE_CONST
#else
#define SHARDTRAIN_ALLOCATE_CONST const
#endif

class CountingAllocator : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) SHARDTRAIN_ALLOCATE_CONST override {
    Ledger& l = ledger();
    const FreedMemory policy = l.policy;
    if (policy != FreedMemory::kMalloc &&
        bytes >= (policy == FreedMemory::kReturn ? kReturnedBlock : kLargeBlock)) {
      const size_t size = size_class(bytes);
      void* ptr = map_large(size);
      count(l, ptr, Block{bytes, size});
      return c10::DataPtr(ptr, ptr, &tracked_free, c10::Device(c10::DeviceType::CPU));
    }
    c10::DataPtr inner = l.inner->allocate(bytes);
    void* ptr = inner.get();
    if (!ptr || inner.get_context() != ptr) return inner;  // not a plain block: leave it be
    inner.release_context();
    count(l, ptr, Block{bytes, 0});
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
  const Ledger& l = ledger();
  return CpuMemoryStats{l.live.load(), l.peak.load(), l.cached.load(), l.limit.load()};
}

void reset_peak_cpu_memory() { ledger().peak.store(ledger().live.load()); }

void set_freed_memory(FreedMemory policy) {
  Ledger& l = ledger();
  std::vector<Kept> released;
  {
    std::lock_guard<std::mutex> lock(l.mutex);
    l.policy = policy;
    if (policy != FreedMemory::kCache) released = take_all_kept(l);
  }
  unmap(released);
}

int64_t large_cpu_block_bytes() { return static_cast<int64_t>(kLargeBlock); }

}  // namespace shardtrain
