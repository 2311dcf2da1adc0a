// The register-only int8 loop of measure_int8_peak_gops (calibrate.h): independent vpdpbusd
// chains, enough of them to cover the instruction's latency, no memory traffic.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "cpu/calibrate.h"

namespace strata::cpu::detail {

double int8_loop_avx512(long iters) {
  // Twelve named accumulators (an array would be kept on the stack across the asm barrier).
  __m512i a0 = _mm512_set1_epi32(0), a1 = _mm512_set1_epi32(1), a2 = _mm512_set1_epi32(2),
          a3 = _mm512_set1_epi32(3), a4 = _mm512_set1_epi32(4), a5 = _mm512_set1_epi32(5),
          a6 = _mm512_set1_epi32(6), a7 = _mm512_set1_epi32(7), a8 = _mm512_set1_epi32(8),
          a9 = _mm512_set1_epi32(9), a10 = _mm512_set1_epi32(10), a11 = _mm512_set1_epi32(11);
  const __m512i x = _mm512_set1_epi8(3), y = _mm512_set1_epi8(-5);
  for (long it = 0; it < iters; ++it) {
    a0 = _mm512_dpbusd_epi32(a0, x, y);
    a1 = _mm512_dpbusd_epi32(a1, x, y);
    a2 = _mm512_dpbusd_epi32(a2, x, y);
    a3 = _mm512_dpbusd_epi32(a3, x, y);
    a4 = _mm512_dpbusd_epi32(a4, x, y);
    a5 = _mm512_dpbusd_epi32(a5, x, y);
    a6 = _mm512_dpbusd_epi32(a6, x, y);
    a7 = _mm512_dpbusd_epi32(a7, x, y);
    a8 = _mm512_dpbusd_epi32(a8, x, y);
    a9 = _mm512_dpbusd_epi32(a9, x, y);
    a10 = _mm512_dpbusd_epi32(a10, x, y);
    a11 = _mm512_dpbusd_epi32(a11, x, y);
    __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6),
                     "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));
  }
  const __m512i s = _mm512_add_epi32(
      _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                       _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7))),
      _mm512_add_epi32(_mm512_add_epi32(a8, a9), _mm512_add_epi32(a10, a11)));
  volatile int sink = _mm512_reduce_add_epi32(s);
  (void)sink;
  return double(iters) * 12 * 64;
}

}  // namespace strata::cpu::detail
