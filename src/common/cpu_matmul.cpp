// bf16 matrix products on CPUs without LibTorch's bf16 GEMM path, computed in fp32.
#include <ATen/ATen.h>
#include <ATen/CPUFunctions.h>
#include <c10/util/Exception.h>
#include <torch/library.h>
#include <torch/version.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "shardtrain/threads.h"

namespace shardtrain {
namespace {

// LibTorch computes a bf16 GEMM through oneDNN when it is built with it and the CPU has the
// AVX-512 subsets oneDNN's bf16 kernels need; elsewhere (every AVX2-only x86 CPU) it falls back
// to scalar loops, about 10x slower than its fp32 GEMM.
bool libtorch_has_fast_bf16_gemm() {
#if defined(__x86_64__) || defined(__i386__)
  return at::hasMKLDNN() && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
  return at::hasMKLDNN();
#endif
}

bool bf16(const at::Tensor& t) { return t.scalar_type() == at::kBFloat16; }
at::Tensor fp32(const at::Tensor& t) { return t.to(at::kFloat); }

// Each kernel: the fp32 product of the bf16 operands (exact in fp32), accumulated in fp32 and
// rounded to bf16 once, which is what a bf16 GEMM with fp32 accumulation returns. Other dtypes
// go to LibTorch's own CPU kernel.
at::Tensor mm(const at::Tensor& a, const at::Tensor& b) {
  if (!bf16(a) || !bf16(b)) return at::cpu::mm(a, b);
  return at::cpu::mm(fp32(a), fp32(b)).to(at::kBFloat16);
}

at::Tensor bmm(const at::Tensor& a, const at::Tensor& b) {
  if (!bf16(a) || !bf16(b)) return at::cpu::bmm(a, b);
  return at::cpu::bmm(fp32(a), fp32(b)).to(at::kBFloat16);
}

at::Tensor addmm(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b,
                 const at::Scalar& beta, const at::Scalar& alpha) {
  if (!bf16(c) || !bf16(a) || !bf16(b)) return at::cpu::addmm(c, a, b, beta, alpha);
  return at::cpu::addmm(fp32(c), fp32(a), fp32(b), beta, alpha).to(at::kBFloat16);
}

at::Tensor baddbmm(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b,
                   const at::Scalar& beta, const at::Scalar& alpha) {
  if (!bf16(c) || !bf16(a) || !bf16(b)) return at::cpu::baddbmm(c, a, b, beta, alpha);
  return at::cpu::baddbmm(fp32(c), fp32(a), fp32(b), beta, alpha).to(at::kBFloat16);
}

// Replaces the four GEMM operators' CPU kernels, once per process, unless
// SHARDTRAIN_CPU_BF16_GEMM=libtorch keeps LibTorch's (another value than those two is refused). The
// dispatcher warns when a kernel replaces another; that warning is the intended effect here and is
// not shown.
bool install() {
  const char* choice = std::getenv("SHARDTRAIN_CPU_BF16_GEMM");
  if (choice && std::string(choice) == "libtorch") return false;
  if (choice && std::string(choice) != "shardtrain") {
    throw std::invalid_argument(
        std::string("SHARDTRAIN_CPU_BF16_GEMM must be \"shardtrain\" (the ") +
        "default) or \"libtorch\", got \"" + choice + "\"");
  }
  if (libtorch_has_fast_bf16_gemm()) return false;
  struct Quiet : c10::WarningHandler {
#if TORCH_VERSION_MAJOR >= 2
    void process(const c10::Warning&) override {}
  } quiet;
  const c10::WarningUtils::WarningHandlerGuard guard(&quiet);
#else
    void process(const c10::SourceLocation&, const std::string&, bool) override {}
  } quiet;
  const c10::Warning::WarningHandlerGuard guard(&quiet);
#endif
  static auto* const library =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::CPU, __FILE__, __LINE__);
  library->impl("mm", TORCH_FN(mm));
  library->impl("bmm", TORCH_FN(bmm));
  library->impl("addmm", TORCH_FN(addmm));
  library->impl("baddbmm", TORCH_FN(baddbmm));
  return true;
}

}  // namespace

bool use_fp32_gemm_for_cpu_bf16() {
  static const bool installed = install();
  return installed;
}

}  // namespace shardtrain
