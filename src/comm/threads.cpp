#include "shardtrain/threads.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <stdexcept>
#include <string>

namespace shardtrain {
namespace {

// OpenBLAS's entry points, looked up at run time: LibTorch links whichever BLAS the system
// provides (OpenBLAS, the reference BLAS, MKL), so they may be absent.
template <typename Fn>
Fn openblas_symbol(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

}  // namespace

void set_num_threads(int threads) {
  if (threads < 1) {
    throw std::invalid_argument("set_num_threads: threads must be >= 1, got " +
                                std::to_string(threads));
  }
  at::set_num_threads(threads);
  if (auto set = openblas_symbol<void (*)(int)>("openblas_set_num_threads")) set(threads);
}

int blas_num_threads() {
  auto get = openblas_symbol<int (*)()>("openblas_get_num_threads");
  return get ? get() : 0;
}

}  // namespace shardtrain
