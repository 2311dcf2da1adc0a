// AVX2 + FMA + F16C variants of the float weight dot products (kernels.h): F32, F16 and BF16
// weights against float activations (their vec_dot_type is f32 in strata). Same signature and
// contract as ref::vec_dot_f16_f32 / vec_dot_bf16_f32 (quant_ref.h): any n >= 0.
//
// Math. Each weight widens exactly to float (F16: vcvtph2ps; BF16: the 16 bits are the top half
// of the float), and the products are summed by FMA into 4 x 8 float lanes, reduced at the end;
// the last n % 8 elements are added in scalar code. The reference sums in double, so the result
// differs by float rounding only (tests/test_simd_kernels.cpp states the bound).
//
// Four accumulators (32 elements, 64 weight bytes, per step) keep enough FMAs in flight to hide
// their latency; the loop then runs at the speed of the weight stream.
//
// Compiled with -mavx2 -mfma -mf16c; called only when the CPU has them. No inline function of the
// shared headers is used here (see simd_common.h).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cpu/avx2/simd_common.h"
#include "cpu/kernels.h"

namespace strata::cpu {
namespace {

// 8 weights at w as floats, and one.
struct F32 {
  using T = float;
  static __m256 load8(const float* w) { return _mm256_loadu_ps(w); }
  static float one(float x) { return x; }
};
struct F16 {
  using T = uint16_t;
  static __m256 load8(const uint16_t* w) { return _mm256_cvtph_ps(load16(w)); }
  static float one(uint16_t h) { return half_to_float(h); }
};
struct Bf16 {
  using T = uint16_t;
  static __m256 load8(const uint16_t* w) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load16(w)), 16));
  }
  static float one(uint16_t h) {
    const uint32_t bits = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
};

template <class W>
float vec_dot_float(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const typename W::T*>(vw);
  const auto* a = static_cast<const float*>(va);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm256_fmadd_ps(W::load8(w + i), _mm256_loadu_ps(a + i), acc0);
    acc1 = _mm256_fmadd_ps(W::load8(w + i + 8), _mm256_loadu_ps(a + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(W::load8(w + i + 16), _mm256_loadu_ps(a + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(W::load8(w + i + 24), _mm256_loadu_ps(a + i + 24), acc3);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(W::load8(w + i), _mm256_loadu_ps(a + i), acc0);
  float tail = 0.0f;
  for (; i < n; ++i) tail += W::one(w[i]) * a[i];
  return hsum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3))) + tail;
}

}  // namespace

namespace detail {

void add_avx2_float_kernels(VecDotFn* vec_dot) {
  vec_dot[size_t(GgmlType::f32)] = vec_dot_float<F32>;
  vec_dot[size_t(GgmlType::f16)] = vec_dot_float<F16>;
  vec_dot[size_t(GgmlType::bf16)] = vec_dot_float<Bf16>;
}

}  // namespace detail
}  // namespace strata::cpu
