// Intra-op threads for LibTorch and the BLAS it calls, set together.
#pragma once

namespace shardtrain {

// Sets LibTorch's intra-op threads (at::set_num_threads) and, when LibTorch's BLAS is OpenBLAS,
// OpenBLAS's own thread pool, which at::set_num_threads does not reach: without it every matrix
// multiply of a rank told to use one thread still runs on as many threads as the machine has
// cores. Throws std::invalid_argument when threads < 1.
void set_num_threads(int threads);

// Threads the BLAS's own pool uses, or 0 when the BLAS has no pool it can be asked about (it is
// not OpenBLAS, or it is LibTorch's built-in MKL, which follows at::set_num_threads).
int blas_num_threads();

}  // namespace shardtrain
