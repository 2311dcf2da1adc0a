// AVX-512 variants of the float weight dot products (kernels.h): F32, F16 and BF16 weights
// against float activations (their vec_dot_type is f32 in strata). Same signature and contract
// as ref::vec_dot_f16_f32 / vec_dot_bf16_f32 (quant_ref.h): any n >= 0.
//
// Math. Each weight widens exactly to float (F16: vcvtph2ps; BF16: the 16 bits are the top half
// of the float), and the products are summed by FMA into 4 x 16 float lanes, reduced at the end.
// The reference sums in double, so the result differs by float rounding only: lane sums of
// n / 64 terms plus the reduction (tests/test_simd_kernels.cpp states the bound). No product is
// rounded before its addition, and the activations keep all their bits (a vdpbf16ps variant would
// round them to bf16).
//
// Four accumulators of 16 lanes (64 elements, 128 weight bytes, per step) keep enough FMAs in
// flight to hide their latency; the loop then runs at the speed of the weight stream.
//
// Compiled with the AVX-512 flags of this directory; called only when the CPU has them.

// GCC 12's avx512fintrin.h initialises its "undefined" vectors from themselves (GCC PR 105593),
// which -Wuninitialized then reports at every inlined use; fixed in GCC 13.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "cpu/kernels.h"

namespace strata::cpu {
namespace {

// 16 weights at w as floats; with `valid`, only those lanes are read (the others are 0).
struct F32 {
  using T = float;
  static __m512 load16(const float* w) { return _mm512_loadu_ps(w); }
  static __m512 load16(const float* w, __mmask16 valid) { return _mm512_maskz_loadu_ps(valid, w); }
};
struct F16 {
  using T = uint16_t;
  static __m512 load16(const uint16_t* w) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
  }
  static __m512 load16(const uint16_t* w, __mmask16 valid) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(valid, w));
  }
};
struct Bf16 {
  using T = uint16_t;
  static __m512 widen(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
  static __m512 load16(const uint16_t* w) { return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w))); }
  static __m512 load16(const uint16_t* w, __mmask16 valid) { return widen(_mm256_maskz_loadu_epi16(valid, w)); }
};

template <class W>
float vec_dot_float(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const typename W::T*>(vw);
  const auto* a = static_cast<const float*>(va);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  __m512 acc2 = _mm512_setzero_ps(), acc3 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    acc0 = _mm512_fmadd_ps(W::load16(w + i), _mm512_loadu_ps(a + i), acc0);
    acc1 = _mm512_fmadd_ps(W::load16(w + i + 16), _mm512_loadu_ps(a + i + 16), acc1);
    acc2 = _mm512_fmadd_ps(W::load16(w + i + 32), _mm512_loadu_ps(a + i + 32), acc2);
    acc3 = _mm512_fmadd_ps(W::load16(w + i + 48), _mm512_loadu_ps(a + i + 48), acc3);
  }
  for (; i + 16 <= n; i += 16) acc0 = _mm512_fmadd_ps(W::load16(w + i), _mm512_loadu_ps(a + i), acc0);
  if (i < n) {
    // the last n - i < 16 elements by masked loads (the lanes past n are 0 * 0)
    const __mmask16 valid = _cvtu32_mask16((1u << (n - i)) - 1);
    acc1 = _mm512_fmadd_ps(W::load16(w + i, valid), _mm512_maskz_loadu_ps(valid, a + i), acc1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
}

}  // namespace

namespace detail {

void add_avx512_float_kernels(VecDotFn* vec_dot) {
  vec_dot[size_t(GgmlType::f32)] = vec_dot_float<F32>;
  vec_dot[size_t(GgmlType::f16)] = vec_dot_float<F16>;
  vec_dot[size_t(GgmlType::bf16)] = vec_dot_float<Bf16>;
}

}  // namespace detail
}  // namespace strata::cpu
