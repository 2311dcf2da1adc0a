// The register-only int8 loop of measure_int8_peak_gops (calibrate.h) for AVX2: vpmaddubsw (u8 x
// s8 pairs into int16) then vpmaddwd (pairs into int32) and vpaddd, the sequence AVX2 dot products
// use, in independent chains.
#include <immintrin.h>

#include "cpu/calibrate.h"

namespace strata::cpu::detail {

double int8_loop_avx2(long iters) {
  constexpr int kChains = 6;  // 6 accumulators + 6 inputs + 2 constants: within the 16 ymm
  __m256i acc[kChains], x[kChains];
  for (int i = 0; i < kChains; ++i) {
    acc[i] = _mm256_set1_epi32(i);
    x[i] = _mm256_set1_epi8(char(3 + i));
  }
  const __m256i b = _mm256_set1_epi8(-5), ones = _mm256_set1_epi16(1);
  for (long it = 0; it < iters; ++it) {
    for (int i = 0; i < kChains; ++i)
      acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(x[i], b), ones));
    // the inputs "change" every iteration: nothing is hoisted out of the loop
    __asm__ volatile("" : "+v"(acc[0]), "+v"(acc[1]), "+v"(acc[2]), "+v"(acc[3]), "+v"(acc[4]),
                     "+v"(acc[5]), "+v"(x[0]), "+v"(x[1]), "+v"(x[2]), "+v"(x[3]), "+v"(x[4]),
                     "+v"(x[5]));
  }
  __m256i s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm256_add_epi32(s, acc[i]);
  alignas(32) int out[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), s);
  volatile int sink = out[0];
  (void)sink;
  return double(iters) * kChains * 32;
}

}  // namespace strata::cpu::detail
