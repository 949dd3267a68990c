// shardtrain <subcommand>: parses arguments into option structs and calls the library.
#include <malloc.h>

#include <cstdlib>
#include <iostream>

#include "app.h"

int main(int argc, char** argv) {
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
