// The register-only loops of the peak probes (calibrate.h) for AVX2. int8: vpmaddubsw (u8 x s8
// pairs into int16) then vpmaddwd (pairs into int32) and vpaddd, the sequence AVX2 dot products
// use, in independent chains. Float: vfmadd231ps on ymm (the bf16 probe's stand-in without
// AVX-512).
#include <immintrin.h>

#include "cpu/calibrate.h"

namespace strata::cpu::detail {

double int8_loop_avx2(long iters) {
  // Six chains (named: an array would be kept on the stack across the asm barrier) with their
  // own inputs: 6 + 6 + 2 of the 16 ymm registers.
  __m256i a0 = _mm256_set1_epi32(0), a1 = _mm256_set1_epi32(1), a2 = _mm256_set1_epi32(2),
          a3 = _mm256_set1_epi32(3), a4 = _mm256_set1_epi32(4), a5 = _mm256_set1_epi32(5);
  __m256i x0 = _mm256_set1_epi8(3), x1 = _mm256_set1_epi8(4), x2 = _mm256_set1_epi8(5),
          x3 = _mm256_set1_epi8(6), x4 = _mm256_set1_epi8(7), x5 = _mm256_set1_epi8(8);
  const __m256i b = _mm256_set1_epi8(-5), ones = _mm256_set1_epi16(1);
  for (long it = 0; it < iters; ++it) {
    a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_maddubs_epi16(x0, b), ones));
    a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(_mm256_maddubs_epi16(x1, b), ones));
    a2 = _mm256_add_epi32(a2, _mm256_madd_epi16(_mm256_maddubs_epi16(x2, b), ones));
    a3 = _mm256_add_epi32(a3, _mm256_madd_epi16(_mm256_maddubs_epi16(x3, b), ones));
    a4 = _mm256_add_epi32(a4, _mm256_madd_epi16(_mm256_maddubs_epi16(x4, b), ones));
    a5 = _mm256_add_epi32(a5, _mm256_madd_epi16(_mm256_maddubs_epi16(x5, b), ones));
    // the inputs "change" every iteration: nothing is hoisted out of the loop
    __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(x0),
                     "+v"(x1), "+v"(x2), "+v"(x3), "+v"(x4), "+v"(x5));
  }
  const __m256i s = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3)),
                                     _mm256_add_epi32(a4, a5));
  alignas(32) int out[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), s);
  volatile int sink = out[0];
  (void)sink;
  return double(iters) * 6 * 32;
}

double f32_fma_loop_avx2(long iters) {
  // Twelve chains (named, as above) and two inputs: 14 of the 16 ymm registers.
  __m256 a0 = _mm256_set1_ps(0), a1 = _mm256_set1_ps(1), a2 = _mm256_set1_ps(2), a3 = _mm256_set1_ps(3),
         a4 = _mm256_set1_ps(4), a5 = _mm256_set1_ps(5), a6 = _mm256_set1_ps(6), a7 = _mm256_set1_ps(7),
         a8 = _mm256_set1_ps(8), a9 = _mm256_set1_ps(9), a10 = _mm256_set1_ps(10), a11 = _mm256_set1_ps(11);
  // a = a * 0.5 + 1 converges to 2: finite, no denormals
  const __m256 x = _mm256_set1_ps(0.5f), y = _mm256_set1_ps(1.0f);
  for (long it = 0; it < iters; ++it) {
    a0 = _mm256_fmadd_ps(a0, x, y);
    a1 = _mm256_fmadd_ps(a1, x, y);
    a2 = _mm256_fmadd_ps(a2, x, y);
    a3 = _mm256_fmadd_ps(a3, x, y);
    a4 = _mm256_fmadd_ps(a4, x, y);
    a5 = _mm256_fmadd_ps(a5, x, y);
    a6 = _mm256_fmadd_ps(a6, x, y);
    a7 = _mm256_fmadd_ps(a7, x, y);
    a8 = _mm256_fmadd_ps(a8, x, y);
    a9 = _mm256_fmadd_ps(a9, x, y);
    a10 = _mm256_fmadd_ps(a10, x, y);
    a11 = _mm256_fmadd_ps(a11, x, y);
    __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6),
                     "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));
  }
  const __m256 s = _mm256_add_ps(
      _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                    _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7))),
      _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
  alignas(32) float out[8];
  _mm256_store_ps(out, s);
  volatile float sink = out[0];
  (void)sink;
  return double(iters) * 12 * 8;
}

}  // namespace strata::cpu::detail
