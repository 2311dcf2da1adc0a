// Forced include (-include) of the AVX-512 kernel sources in the emulated test build
// (tests/CMakeLists.txt, strata_tests_avx512emu): AVX-512 F/BW/VL/DQ/VNNI/BF16/VBMI intrinsics
// on a CPU with AVX2 only, through SIMDe (libsimde-dev: its native aliases turn each _mm512_*
// name into simde_mm512_*, computed on pairs of 256-bit vectors), so that those kernels run
// against their scalar references on the project's AVX2 machines too. The intrinsics the
// packaged SIMDe (0.7.4) lacks are defined below, lane by lane: for tests, never for speed.
// Masked loads and stores touch only the lanes their mask selects, as the hardware's do.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#include "cpu/fp16.h"

namespace strata_avx512_emulation {

template <class T, int N, class V>
inline void to_lanes(const V& v, T (&x)[N]) {
  static_assert(sizeof(V) == sizeof(T) * N);
  std::memcpy(x, &v, sizeof(V));
}
template <class V, class T, int N>
inline V from_lanes(const T (&x)[N]) {
  static_assert(sizeof(V) == sizeof(T) * N);
  V v;
  std::memcpy(&v, x, sizeof(V));
  return v;
}

// one lane-wise conversion from N lanes of From (in a vector of type VA) to N lanes of To (VR)
template <class VR, class To, class From, int N, class VA, class F>
inline VR convert(const VA& a, F f) {
  From x[N];
  To r[N];
  to_lanes(a, x);
  for (int i = 0; i < N; ++i) r[i] = f(x[i]);
  return from_lanes<VR>(r);
}

inline int32_t round_to_int32(float f) {  // vcvtps2dq with MXCSR's default rounding
  return _mm_cvtss_si32(_mm_set_ss(f));
}

// __builtin_cpu_supports in the kernel sources: every AVX-512 extension present (VBMI too: its
// kernels replace the plain AVX-512 ones where the CPU has it, as on Zen 4 / 5 and Ice Lake on),
// the rest as the CPU says
inline bool is_avx512(const char* feature) {
  return std::strncmp(feature, "avx512", 6) == 0;
}

inline simde__mmask16 cvtu32_mask16(uint32_t u) {
  return simde__mmask16(u);
}
inline simde__mmask64 cvtu64_mask64(uint64_t u) {
  return simde__mmask64(u);
}
inline simde__mmask16 knot16(simde__mmask16 m) {
  return simde__mmask16(~m);
}

inline simde__m256i mm256_maskz_loadu_epi16(simde__mmask16 k, const void* p) {
  int16_t r[16] = {};
  for (int i = 0; i < 16; ++i)
    if (k >> i & 1) std::memcpy(&r[i], static_cast<const char*>(p) + 2 * i, 2);
  return from_lanes<simde__m256i>(r);
}
inline simde__m512 mm512_maskz_loadu_ps(simde__mmask16 k, const void* p) {
  float r[16] = {};
  for (int i = 0; i < 16; ++i)
    if (k >> i & 1) std::memcpy(&r[i], static_cast<const char*>(p) + 4 * i, 4);
  return from_lanes<simde__m512>(r);
}
inline void mm512_mask_storeu_ps(void* p, simde__mmask16 k, simde__m512 a) {
  float x[16];
  to_lanes(a, x);
  for (int i = 0; i < 16; ++i)
    if (k >> i & 1) std::memcpy(static_cast<char*>(p) + 4 * i, &x[i], 4);
}
inline simde__m512i mm512_mask_i32gather_epi32(simde__m512i src, simde__mmask16 k, simde__m512i idx,
                                               const void* base, int scale) {
  int32_t r[16], ix[16];
  to_lanes(src, r);
  to_lanes(idx, ix);
  for (int i = 0; i < 16; ++i)
    if (k >> i & 1) std::memcpy(&r[i], static_cast<const char*>(base) + int64_t(ix[i]) * scale, 4);
  return from_lanes<simde__m512i>(r);
}

inline simde__mmask16 mm512_cmplt_epu32_mask(simde__m512i a, simde__m512i b) {
  uint32_t x[16], y[16];
  to_lanes(a, x);
  to_lanes(b, y);
  simde__mmask16 m = 0;
  for (int i = 0; i < 16; ++i) m = simde__mmask16(m | (x[i] < y[i]) << i);
  return m;
}

inline simde__m512i mm512_cvtepi16_epi32(simde__m256i a) {
  return convert<simde__m512i, int32_t, int16_t, 16>(a, [](int16_t v) { return int32_t(v); });
}
inline simde__m512i mm512_cvtepu16_epi32(simde__m256i a) {
  return convert<simde__m512i, int32_t, uint16_t, 16>(a, [](uint16_t v) { return int32_t(v); });
}
inline simde__m512i mm512_cvtepu8_epi32(simde__m128i a) {
  return convert<simde__m512i, int32_t, uint8_t, 16>(a, [](uint8_t v) { return int32_t(v); });
}
inline simde__m256i mm512_cvtepi32_epi16(simde__m512i a) {  // truncation (vpmovdw)
  return convert<simde__m256i, int16_t, int32_t, 16>(a, [](int32_t v) { return int16_t(v); });
}
inline simde__m512 mm512_cvtepi32_ps(simde__m512i a) {
  return convert<simde__m512, float, int32_t, 16>(a, [](int32_t v) { return float(v); });
}
inline simde__m512i mm512_cvtps_epi32(simde__m512 a) {
  return convert<simde__m512i, int32_t, float, 16>(a, round_to_int32);
}
inline simde__m512 mm512_cvtph_ps(simde__m256i a) {
  return convert<simde__m512, float, uint16_t, 16>(a, strata::fp16_to_f32);
}
// bf16 lanes 0-15 from b, 16-31 from a, rounded to nearest even (vcvtne2ps2bf16)
inline simde__m512bh mm512_cvtne2ps_pbh(simde__m512 a, simde__m512 b) {
  float x[16], y[16];
  to_lanes(a, x);
  to_lanes(b, y);
  uint16_t r[32];
  for (int i = 0; i < 16; ++i) {
    r[i] = strata::f32_to_bf16(y[i]);
    r[16 + i] = strata::f32_to_bf16(x[i]);
  }
  return from_lanes<simde__m512bh>(r);
}

inline simde__m512i mm512_srai_epi32(simde__m512i a, unsigned n) {
  return convert<simde__m512i, int32_t, int32_t, 16>(
      a, [n](int32_t v) { return n > 31 ? (v < 0 ? -1 : 0) : v >> n; });
}
inline simde__m512i mm512_mask_srli_epi16(simde__m512i src, simde__mmask32 k, simde__m512i a,
                                          unsigned n) {
  uint16_t r[32], x[32];
  to_lanes(src, r);
  to_lanes(a, x);
  for (int i = 0; i < 32; ++i)
    if (k >> i & 1) r[i] = n > 15 ? 0 : uint16_t(x[i] >> n);
  return from_lanes<simde__m512i>(r);
}
// dst's 128-bit lanes: a[imm bits 0-1], a[2-3], b[4-5], b[6-7]
inline simde__m512 mm512_shuffle_f32x4(simde__m512 a, simde__m512 b, int imm) {
  float x[16], y[16], r[16];
  to_lanes(a, x);
  to_lanes(b, y);
  for (int l = 0; l < 4; ++l)
    std::memcpy(&r[4 * l], (l < 2 ? x : y) + 4 * ((imm >> (2 * l)) & 3), 16);
  return from_lanes<simde__m512>(r);
}
inline simde__m512i mm512_zextsi256_si512(simde__m256i a) {
  int32_t r[16] = {};
  std::memcpy(r, &a, 32);
  return from_lanes<simde__m512i>(r);
}

// reductions in the hardware sequence's order: halves added (max'd) pairwise down to one lane
template <class T, class V, class F>
inline T reduce(const V& a, F f) {
  T x[16];
  to_lanes(a, x);
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) x[i] = f(x[i], x[i + w]);
  return x[0];
}
inline float mm512_reduce_add_ps(simde__m512 a) {
  return reduce<float>(a, [](float x, float y) { return x + y; });
}
inline float mm512_reduce_max_ps(simde__m512 a) {
  return reduce<float>(a, [](float x, float y) { return x > y ? x : y; });
}
inline int32_t mm512_reduce_add_epi32(simde__m512i a) {
  return reduce<int32_t>(a,
                         [](int32_t x, int32_t y) { return int32_t(uint32_t(x) + uint32_t(y)); });
}

}  // namespace strata_avx512_emulation

#define __builtin_cpu_supports(feature) \
  (strata_avx512_emulation::is_avx512(feature) || __builtin_cpu_supports(feature))
#undef _cvtu32_mask16
#undef _cvtu64_mask64
#undef _knot_mask16
#define _cvtu32_mask16(u) strata_avx512_emulation::cvtu32_mask16(u)
#define _cvtu64_mask64(u) strata_avx512_emulation::cvtu64_mask64(u)
#define _knot_mask16(m) strata_avx512_emulation::knot16(m)
#define _mm256_maskz_loadu_epi16(k, p) strata_avx512_emulation::mm256_maskz_loadu_epi16(k, p)
#define _mm512_maskz_loadu_ps(k, p) strata_avx512_emulation::mm512_maskz_loadu_ps(k, p)
#define _mm512_mask_storeu_ps(p, k, a) strata_avx512_emulation::mm512_mask_storeu_ps(p, k, a)
#define _mm512_mask_i32gather_epi32(src, k, idx, base, scale) \
  strata_avx512_emulation::mm512_mask_i32gather_epi32(src, k, idx, base, scale)
#define _mm512_cmplt_epu32_mask(a, b) strata_avx512_emulation::mm512_cmplt_epu32_mask(a, b)
#define _mm512_cvtepi16_epi32(a) strata_avx512_emulation::mm512_cvtepi16_epi32(a)
#define _mm512_cvtepu16_epi32(a) strata_avx512_emulation::mm512_cvtepu16_epi32(a)
#define _mm512_cvtepu8_epi32(a) strata_avx512_emulation::mm512_cvtepu8_epi32(a)
#define _mm512_cvtepi32_epi16(a) strata_avx512_emulation::mm512_cvtepi32_epi16(a)
#define _mm512_cvtepi32_ps(a) strata_avx512_emulation::mm512_cvtepi32_ps(a)
#define _mm512_cvtps_epi32(a) strata_avx512_emulation::mm512_cvtps_epi32(a)
#define _mm512_cvtph_ps(a) strata_avx512_emulation::mm512_cvtph_ps(a)
#define _mm512_cvtne2ps_pbh(a, b) strata_avx512_emulation::mm512_cvtne2ps_pbh(a, b)
#define _mm512_srai_epi32(a, n) strata_avx512_emulation::mm512_srai_epi32(a, n)
#define _mm512_mask_srli_epi16(src, k, a, n) \
  strata_avx512_emulation::mm512_mask_srli_epi16(src, k, a, n)
#define _mm512_shuffle_f32x4(a, b, imm) strata_avx512_emulation::mm512_shuffle_f32x4(a, b, imm)
#define _mm512_zextsi256_si512(a) strata_avx512_emulation::mm512_zextsi256_si512(a)
#define _mm512_reduce_add_ps(a) strata_avx512_emulation::mm512_reduce_add_ps(a)
#define _mm512_reduce_max_ps(a) strata_avx512_emulation::mm512_reduce_max_ps(a)
#define _mm512_reduce_add_epi32(a) strata_avx512_emulation::mm512_reduce_add_epi32(a)
