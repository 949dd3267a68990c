// Intra-op threads for LibTorch and the BLAS it calls, set together, and the CPU's bf16 matrix
// products.
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

// Makes bf16 matrix products on the CPU (mm, bmm, addmm, baddbmm, so linear layers and attention
// under bf16 autocast or with bf16 weights, forward and backward) compute as the fp32 product of
// their bf16 operands, accumulated in fp32 and rounded to bf16 once: the values a bf16 GEMM with
// fp32 accumulation returns, at the speed of LibTorch's fp32 GEMM. Only where LibTorch itself
// has no fast bf16 GEMM (no oneDNN, or a CPU without AVX-512: LibTorch 1.13 then runs scalar
// loops, about 10x slower than fp32); elsewhere nothing changes. Once per process, for the whole
// process; returns whether the kernels were replaced. The trainer and the shardtrain binary call
// it; SHARDTRAIN_CPU_BF16_GEMM=libtorch in the environment keeps LibTorch's kernels ("shardtrain",
// the default, replaces them; another value throws std::invalid_argument naming it).
bool use_fp32_gemm_for_cpu_bf16();

}  // namespace shardtrain
