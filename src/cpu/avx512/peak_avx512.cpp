// The register-only loops of the AVX-512 peak probes (calibrate.h): int8 (vpdpbusd), bf16
// (vdpbf16ps) and float FMA (vfmadd231ps zmm), each in independent chains, enough of them to cover
// the instruction's latency on two pipes, no memory traffic.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdint>

#include "cpu/calibrate.h"

// The asm barrier's constraint: the accumulators in vector registers. The emulated build of the
// tests (tests/avx512_emulation) holds its 512-bit vectors in memory.
#ifdef STRATA_AVX512_EMULATION
#define STRATA_IN_REG "+m"
#else
#define STRATA_IN_REG "+v"
#endif

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
    __asm__ volatile(""
                     : STRATA_IN_REG(a0), STRATA_IN_REG(a1), STRATA_IN_REG(a2), STRATA_IN_REG(a3),
                       STRATA_IN_REG(a4), STRATA_IN_REG(a5), STRATA_IN_REG(a6), STRATA_IN_REG(a7),
                       STRATA_IN_REG(a8), STRATA_IN_REG(a9), STRATA_IN_REG(a10),
                       STRATA_IN_REG(a11));
  }
  const __m512i s = _mm512_add_epi32(
      _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                       _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7))),
      _mm512_add_epi32(_mm512_add_epi32(a8, a9), _mm512_add_epi32(a10, a11)));
  // summed as unsigned: the accumulators wrap by design (gcc's _mm512_reduce_add_epi32 adds as int,
  // which UBSan reports as signed overflow)
  alignas(64) uint32_t lanes[16];
  _mm512_store_si512(lanes, s);
  uint32_t sum = 0;
  for (uint32_t v : lanes) sum += v;
  volatile uint32_t sink = sum;
  (void)sink;
  return double(iters) * 12 * 64;
}

// AVX512_BF16 is not in this directory's flags (Skylake-X, Ice Lake and Sapphire Rapids' older
// siblings lack it): only this function is compiled for it, and calibrate.cpp calls it only after
// a cpuid check.
__attribute__((target("avx512bf16"))) double bf16_loop_avx512(long iters) {
  __m512 a0 = _mm512_set1_ps(0), a1 = _mm512_set1_ps(1), a2 = _mm512_set1_ps(2), a3 = _mm512_set1_ps(3),
         a4 = _mm512_set1_ps(4), a5 = _mm512_set1_ps(5), a6 = _mm512_set1_ps(6), a7 = _mm512_set1_ps(7),
         a8 = _mm512_set1_ps(8), a9 = _mm512_set1_ps(9), a10 = _mm512_set1_ps(10), a11 = _mm512_set1_ps(11);
  // 32 bf16 values each (pairs of 0.5, -0.25: sums stay finite, no denormals)
  const __m512bh x = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(0.5f));
  const __m512bh y = _mm512_cvtne2ps_pbh(_mm512_set1_ps(-0.25f), _mm512_set1_ps(-0.25f));
  for (long it = 0; it < iters; ++it) {
    a0 = _mm512_dpbf16_ps(a0, x, y);
    a1 = _mm512_dpbf16_ps(a1, x, y);
    a2 = _mm512_dpbf16_ps(a2, x, y);
    a3 = _mm512_dpbf16_ps(a3, x, y);
    a4 = _mm512_dpbf16_ps(a4, x, y);
    a5 = _mm512_dpbf16_ps(a5, x, y);
    a6 = _mm512_dpbf16_ps(a6, x, y);
    a7 = _mm512_dpbf16_ps(a7, x, y);
    a8 = _mm512_dpbf16_ps(a8, x, y);
    a9 = _mm512_dpbf16_ps(a9, x, y);
    a10 = _mm512_dpbf16_ps(a10, x, y);
    a11 = _mm512_dpbf16_ps(a11, x, y);
    __asm__ volatile(""
                     : STRATA_IN_REG(a0), STRATA_IN_REG(a1), STRATA_IN_REG(a2), STRATA_IN_REG(a3),
                       STRATA_IN_REG(a4), STRATA_IN_REG(a5), STRATA_IN_REG(a6), STRATA_IN_REG(a7),
                       STRATA_IN_REG(a8), STRATA_IN_REG(a9), STRATA_IN_REG(a10),
                       STRATA_IN_REG(a11));
  }
  const __m512 s = _mm512_add_ps(
      _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                    _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7))),
      _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
  volatile float sink = _mm512_reduce_add_ps(s);
  (void)sink;
  return double(iters) * 12 * 32;  // 16 float lanes, each a sum of two bf16 products
}

double f32_fma_loop_avx512(long iters) {
  __m512 a0 = _mm512_set1_ps(0), a1 = _mm512_set1_ps(1), a2 = _mm512_set1_ps(2), a3 = _mm512_set1_ps(3),
         a4 = _mm512_set1_ps(4), a5 = _mm512_set1_ps(5), a6 = _mm512_set1_ps(6), a7 = _mm512_set1_ps(7),
         a8 = _mm512_set1_ps(8), a9 = _mm512_set1_ps(9), a10 = _mm512_set1_ps(10), a11 = _mm512_set1_ps(11);
  // a = a * 0.5 + 1 converges to 2: finite, no denormals
  const __m512 x = _mm512_set1_ps(0.5f), y = _mm512_set1_ps(1.0f);
  for (long it = 0; it < iters; ++it) {
    a0 = _mm512_fmadd_ps(a0, x, y);
    a1 = _mm512_fmadd_ps(a1, x, y);
    a2 = _mm512_fmadd_ps(a2, x, y);
    a3 = _mm512_fmadd_ps(a3, x, y);
    a4 = _mm512_fmadd_ps(a4, x, y);
    a5 = _mm512_fmadd_ps(a5, x, y);
    a6 = _mm512_fmadd_ps(a6, x, y);
    a7 = _mm512_fmadd_ps(a7, x, y);
    a8 = _mm512_fmadd_ps(a8, x, y);
    a9 = _mm512_fmadd_ps(a9, x, y);
    a10 = _mm512_fmadd_ps(a10, x, y);
    a11 = _mm512_fmadd_ps(a11, x, y);
    __asm__ volatile(""
                     : STRATA_IN_REG(a0), STRATA_IN_REG(a1), STRATA_IN_REG(a2), STRATA_IN_REG(a3),
                       STRATA_IN_REG(a4), STRATA_IN_REG(a5), STRATA_IN_REG(a6), STRATA_IN_REG(a7),
                       STRATA_IN_REG(a8), STRATA_IN_REG(a9), STRATA_IN_REG(a10),
                       STRATA_IN_REG(a11));
  }
  const __m512 s = _mm512_add_ps(
      _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                    _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7))),
      _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
  volatile float sink = _mm512_reduce_add_ps(s);
  (void)sink;
  return double(iters) * 12 * 16;
}

}  // namespace strata::cpu::detail
