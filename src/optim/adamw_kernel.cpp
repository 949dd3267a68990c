// Per-element AdamW for three instruction sets. Debian builds for generic x86-64, so the AVX2
// and AVX-512 bodies are compiled for their targets (`#pragma GCC target`, clang's target
// attribute) and chosen at run time.
//
// Bit-for-bit agreement with LibTorch 1.13 comes from doing its operations in its order with
// its roundings. On x86-64 LibTorch runs its AVX2 kernels, where add_(g, alpha) is a fused
// multiply-add and the compiler contracts addcmul_'s `v + s*g*g` into fma(s*g, g, v); the two
// vector paths below do exactly that. The generic path rounds every product, as LibTorch's
// kernels for CPUs without AVX2 do. Multiplying by a reciprocal instead of dividing, or an
// rsqrt, would be faster on paper but changes results; the update is memory-bound anyway.

#include "optim/adamw_kernel.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

namespace shardtrain::detail {
namespace {

// c10::BFloat16's rounding: to nearest, ties to even; NaN becomes the quiet NaN 0x7FC0.
inline uint16_t to_bf16(float value) {
  if (std::isnan(value)) return 0x7FC0;
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

void generic_range(const AdamWScalars& s, float* p, const float* g, float* m, float* v,
                   uint16_t* bf16, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float param = s.has_decay ? p[i] * s.decay : p[i];
    const float avg = g[i] * s.one_minus_beta1 + m[i] * s.beta1;
    const float avg_sq = v[i] * s.beta2 + s.one_minus_beta2 * g[i] * g[i];
    const float denom = std::sqrt(avg_sq) / s.sqrt_bias_correction2 + s.eps;
    param = param + s.neg_step_size * avg / denom;
    p[i] = param;
    m[i] = avg;
    v[i] = avg_sq;
    if (bf16) bf16[i] = to_bf16(param);
  }
}

// The last partial vector of a range, zero-padded, so that it goes through the same vector
// arithmetic as the rest.
template <int width>
struct Tail {
  Tail(const float* p, const float* g, const float* m, const float* v, int64_t rest) : rest(rest) {
    std::copy(p, p + rest, tp);
    std::copy(g, g + rest, tg);
    std::copy(m, m + rest, tm);
    std::copy(v, v + rest, tv);
  }
  void write_back(float* p, float* m, float* v, uint16_t* bf16) const {
    std::copy(tp, tp + rest, p);
    std::copy(tm, tm + rest, m);
    std::copy(tv, tv + rest, v);
    if (bf16) std::copy(tb, tb + rest, bf16);
  }
  int64_t rest;
  float tp[width] = {}, tg[width] = {}, tm[width] = {}, tv[width] = {};
  uint16_t tb[width] = {};
};

// GCC takes the target as a pragma; clang as an attribute applied to every function after it.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

// LibTorch applies the weight decay as its own pass, so the product is rounded before the
// update is added to it; left alone, GCC contracts the two into one fused multiply-add.
inline __m256 rounded(__m256 x) {
  asm("" : "+v"(x));
  return x;
}

struct Avx2Constants {
  explicit Avx2Constants(const AdamWScalars& s)
      : has_decay(s.has_decay),
        decay(_mm256_set1_ps(s.decay)),
        beta1(_mm256_set1_ps(s.beta1)),
        omb1(_mm256_set1_ps(s.one_minus_beta1)),
        beta2(_mm256_set1_ps(s.beta2)),
        omb2(_mm256_set1_ps(s.one_minus_beta2)),
        sqrt_bc2(_mm256_set1_ps(s.sqrt_bias_correction2)),
        eps(_mm256_set1_ps(s.eps)),
        neg_step(_mm256_set1_ps(s.neg_step_size)) {}
  bool has_decay;
  __m256 decay, beta1, omb1, beta2, omb2, sqrt_bc2, eps, neg_step;
};

// c10::BFloat16's rounding of 8 floats: add 0x7FFF plus the lowest kept bit, keep the top half.
template <bool stream>
inline void avx2_store_bf16(__m256 x, uint16_t* out) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), lsb), 16);
  const __m256 is_nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(is_nan));
  // packus works per 128-bit lane; the permute brings both lanes' halves together.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0b1000);
  if (stream) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(packed));
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(packed));
  }
}

template <bool stream = false>
inline void avx2_block(const Avx2Constants& c, float* p, const float* g, float* m, float* v,
                       uint16_t* bf16) {
  __m256 param = _mm256_loadu_ps(p);
  const __m256 grad = _mm256_loadu_ps(g);
  if (c.has_decay) param = rounded(_mm256_mul_ps(param, c.decay));
  const __m256 avg = _mm256_fmadd_ps(grad, c.omb1, _mm256_mul_ps(_mm256_loadu_ps(m), c.beta1));
  const __m256 avg_sq = _mm256_fmadd_ps(_mm256_mul_ps(c.omb2, grad), grad,
                                        _mm256_mul_ps(_mm256_loadu_ps(v), c.beta2));
  const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(avg_sq), c.sqrt_bc2), c.eps);
  param = _mm256_add_ps(param, _mm256_div_ps(_mm256_mul_ps(c.neg_step, avg), denom));
  _mm256_storeu_ps(p, param);
  _mm256_storeu_ps(m, avg);
  _mm256_storeu_ps(v, avg_sq);
  if (bf16) avx2_store_bf16<stream>(param, bf16);
}

void avx2_range(const AdamWScalars& s, float* p, const float* g, float* m, float* v, uint16_t* bf16,
                int64_t n) {
  const Avx2Constants c(s);
  int64_t i = 0;
  if (bf16) {
    // Streaming stores for the bf16 copy, as in the AVX-512 path; 16-byte aligned.
    i = std::min<int64_t>(
        n, static_cast<int64_t>((16 - reinterpret_cast<uintptr_t>(bf16) % 16) % 16) / 2);
    if (i > 0) {
      Tail<8> t(p, g, m, v, i);
      avx2_block(c, t.tp, t.tg, t.tm, t.tv, t.tb);
      t.write_back(p, m, v, bf16);
    }
    for (; i + 8 <= n; i += 8) avx2_block<true>(c, p + i, g + i, m + i, v + i, bf16 + i);
    _mm_sfence();
  } else {
    for (; i + 8 <= n; i += 8) avx2_block(c, p + i, g + i, m + i, v + i, nullptr);
  }
  if (i == n) return;
  Tail<8> t(p + i, g + i, m + i, v + i, n - i);
  avx2_block(c, t.tp, t.tg, t.tm, t.tv, bf16 ? t.tb : nullptr);
  t.write_back(p + i, m + i, v + i, bf16 ? bf16 + i : nullptr);
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma")
#endif
// GCC 12's own avx512fintrin.h starts broadcasts from an "undefined" register, which its
// -Wmaybe-uninitialized then reports inside the header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

inline __m512 rounded(__m512 x) {  // as the AVX2 one
  asm("" : "+v"(x));
  return x;
}

struct Avx512Constants {
  explicit Avx512Constants(const AdamWScalars& s)
      : has_decay(s.has_decay),
        decay(_mm512_set1_ps(s.decay)),
        beta1(_mm512_set1_ps(s.beta1)),
        omb1(_mm512_set1_ps(s.one_minus_beta1)),
        beta2(_mm512_set1_ps(s.beta2)),
        omb2(_mm512_set1_ps(s.one_minus_beta2)),
        sqrt_bc2(_mm512_set1_ps(s.sqrt_bias_correction2)),
        eps(_mm512_set1_ps(s.eps)),
        neg_step(_mm512_set1_ps(s.neg_step_size)) {}
  bool has_decay;
  __m512 decay, beta1, omb1, beta2, omb2, sqrt_bc2, eps, neg_step;
};

template <bool stream>
inline void avx512_store_bf16(__m512 x, uint16_t* out) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(
      _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  const __mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  r = _mm512_mask_blend_epi32(is_nan, r, _mm512_set1_epi32(0x7FC0));
  if (stream) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(r));
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(r));
  }
}

template <bool stream = false>
inline void avx512_block(const Avx512Constants& c, float* p, const float* g, float* m, float* v,
                         uint16_t* bf16) {
  __m512 param = _mm512_loadu_ps(p);
  const __m512 grad = _mm512_loadu_ps(g);
  if (c.has_decay) param = rounded(_mm512_mul_ps(param, c.decay));
  const __m512 avg = _mm512_fmadd_ps(grad, c.omb1, _mm512_mul_ps(_mm512_loadu_ps(m), c.beta1));
  const __m512 avg_sq = _mm512_fmadd_ps(_mm512_mul_ps(c.omb2, grad), grad,
                                        _mm512_mul_ps(_mm512_loadu_ps(v), c.beta2));
  const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(avg_sq), c.sqrt_bc2), c.eps);
  param = _mm512_add_ps(param, _mm512_div_ps(_mm512_mul_ps(c.neg_step, avg), denom));
  _mm512_storeu_ps(p, param);
  _mm512_storeu_ps(m, avg);
  _mm512_storeu_ps(v, avg_sq);
  if (bf16) avx512_store_bf16<stream>(param, bf16);
}

void avx512_range(const AdamWScalars& s, float* p, const float* g, float* m, float* v,
                  uint16_t* bf16, int64_t n) {
  const Avx512Constants c(s);
  int64_t i = 0;
  if (bf16) {
    // Nothing reads the bf16 copy again during the step: streaming stores spare reading each of
    // its cache lines before writing it. They need 32-byte alignment, which a lead-in reaches.
    i = std::min<int64_t>(
        n, static_cast<int64_t>((32 - reinterpret_cast<uintptr_t>(bf16) % 32) % 32) / 2);
    if (i > 0) {
      Tail<16> t(p, g, m, v, i);
      avx512_block(c, t.tp, t.tg, t.tm, t.tv, t.tb);
      t.write_back(p, m, v, bf16);
    }
    for (; i + 16 <= n; i += 16) avx512_block<true>(c, p + i, g + i, m + i, v + i, bf16 + i);
    _mm_sfence();
  } else {
    for (; i + 16 <= n; i += 16) avx512_block(c, p + i, g + i, m + i, v + i, nullptr);
  }
  if (i == n) return;
  Tail<16> t(p + i, g + i, m + i, v + i, n - i);
  avx512_block(c, t.tp, t.tg, t.tm, t.tv, bf16 ? t.tb : nullptr);
  t.write_back(p + i, m + i, v + i, bf16 ? bf16 + i : nullptr);
}

#pragma GCC diagnostic pop
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

AdamIsa detect_isa() {
  AdamIsa best = AdamIsa::kGeneric;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = AdamIsa::kAvx2;
  if (best == AdamIsa::kAvx2 && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")) {
    best = AdamIsa::kAvx512;
  }
  if (const char* cap = std::getenv("SHARDTRAIN_ADAM_ISA")) {
    const std::string want(cap);
    if (want == "generic") best = AdamIsa::kGeneric;
    if (want == "avx2" && best == AdamIsa::kAvx512) best = AdamIsa::kAvx2;
  }
  return best;
}

}  // namespace

AdamWScalars AdamWScalars::from(const AdamWStep& hyper) {
  AdamWScalars s;
  s.has_decay = hyper.weight_decay_ != 0;
  s.decay = static_cast<float>(1 - hyper.lr_ * hyper.weight_decay_);
  s.beta1 = static_cast<float>(hyper.beta1_);
  s.one_minus_beta1 = static_cast<float>(1 - hyper.beta1_);
  s.beta2 = static_cast<float>(hyper.beta2_);
  s.one_minus_beta2 = static_cast<float>(1 - hyper.beta2_);
  const double step = static_cast<double>(hyper.step_);
  const double bias_correction1 = hyper.bias_correction_ ? 1 - std::pow(hyper.beta1_, step) : 1.0;
  const double bias_correction2 = hyper.bias_correction_ ? 1 - std::pow(hyper.beta2_, step) : 1.0;
  s.sqrt_bias_correction2 = static_cast<float>(std::sqrt(bias_correction2));
  s.eps = static_cast<float>(hyper.eps_);
  s.neg_step_size = static_cast<float>(-(hyper.lr_ / bias_correction1));
  return s;
}

AdamIsa adam_isa() {
  static const AdamIsa isa = detect_isa();
  return isa;
}

const char* adam_isa_name(AdamIsa isa) {
  switch (isa) {
    case AdamIsa::kAvx512:
      return "avx512";
    case AdamIsa::kAvx2:
      return "avx2";
    default:
      return "generic";
  }
}

void adamw_range(AdamIsa isa, const AdamWScalars& s, float* param, const float* grad,
                 float* exp_avg, float* exp_avg_sq, uint16_t* bf16, int64_t n) {
  switch (isa) {
    case AdamIsa::kAvx512:
      return avx512_range(s, param, grad, exp_avg, exp_avg_sq, bf16, n);
    case AdamIsa::kAvx2:
      return avx2_range(s, param, grad, exp_avg, exp_avg_sq, bf16, n);
    default:
      return generic_range(s, param, grad, exp_avg, exp_avg_sq, bf16, n);
  }
}

}  // namespace shardtrain::detail
