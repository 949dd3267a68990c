// shardtrain <subcommand>: parses arguments into option structs and calls the library.
#include <malloc.h>

#include <cstdlib>
#include <iostream>

#include "app.h"

int main(int argc, char** argv) {
  // Training allocates and frees the same large blocks (logits, activations) every step. glibc
  // serves blocks over 32 MiB with fresh mmaps and unmaps them on free, so each step would fault
  // hundreds of MB back in: keeping them in the heap halves the demo's step time. A user's own
  // MALLOC_* settings win.
  if (!std::getenv("MALLOC_MMAP_MAX_") && !std::getenv("MALLOC_TRIM_THRESHOLD_")) {
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }
  return shardtrain::cli::run(std::vector<std::string>(argv + 1, argv + argc), std::cout,
                              std::cerr);
}
