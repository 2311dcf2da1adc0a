// The register-only int8 loop of measure_int8_peak_gops (calibrate.h) for AVX2: vpmaddubsw (u8 x
// s8 pairs into int16) then vpmaddwd (pairs into int32) and vpaddd, the sequence AVX2 dot products
// use, in independent chains.
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

}  // namespace strata::cpu::detail
