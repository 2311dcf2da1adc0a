// Helpers shared by the AVX2 and AVX-512 kernel translation units (vec_dot_avx2.cpp, attend_*.cpp,
// ../avx512/vec_dot_avx512.cpp). Included only there.
//
// Everything here is in an unnamed namespace on purpose: each including translation unit gets its
// own copy, compiled with its own ISA flags. An inline function with external linkage would be
// one symbol, and the linker could keep the AVX-512 build of it for the AVX2 table (or for scalar
// code, if a shared header's inline function were used) and fault on a CPU without AVX-512.
// For the same reason these files use no inline function or template of the shared headers
// (fp16.h, quant_blocks.h's e8m0_to_f32_half): the conversions they need are below.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cpu/kernels.h"
#include "cpu/kv_format.h"
#include "cpu/quant_blocks.h"

namespace strata::cpu {
namespace {

inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

// v, through an empty asm GCC must assume changes it, in a register. Keeps a chain of integer
// additions in the order written (GCC reassociates it into a tree whose partial sums do not fit
// the 16 registers, and spills them), and a vector used several times loaded once (GCC folds
// the load into each use as a memory operand). By value: an array element named in an asm
// operand is kept in memory.
inline __m256i opaque(__m256i v) {
  __asm__("" : "+x"(v));
  return v;
}

// 2^(e - 128): half the E8M0 value (as e8m0_to_f32_half in quant_blocks.h).
inline float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? (0x00200000u << e) : (uint32_t(e - 1) << 23);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline __m128i load16(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// Decode attention (AttendFn): bytes on their way to L1 (Hint T0; T1: to L2) a few lines at a
// time, paced by the kernel's loop. A key block's scores loop brings in the block's value rows, its
// value loop the next key block, so each line is asked for about half a block's compute ahead and a
// thread never has more misses in flight than its fill buffers hold. The same lines fetched in a
// burst at the start of each block left one thread reading an f16 cache at 6-8 GB/s from DRAM
// against 21 GB/s with the cache in L2; paced, 19 (AMD EPYC Zen 5, one thread, 256-key chunks).
template <int Hint>
class PacedPrefetchTo {
 public:
  PacedPrefetchTo() = default;
  // [p, p + bytes): one line a step() (the last one again once all are asked for), and rest()
  // asks for whatever the steps left. Branch-free: GCC keeps a hot loop's accumulators in place
  // around it, where a loop inside step() made it copy them at every call. Addresses as integers:
  // a default (empty) one steps from address 0 without pointer arithmetic on null.
  PacedPrefetchTo(const uint8_t* p, size_t bytes)
      : p_(reinterpret_cast<uintptr_t>(p) & ~uintptr_t(63)),
        end_((reinterpret_cast<uintptr_t>(p) + bytes + 63) & ~uintptr_t(63)) {}
  void step() {
    _mm_prefetch(reinterpret_cast<const char*>(p_), _mm_hint(Hint));
    p_ = p_ + 64 < end_ ? p_ + 64 : p_;
  }
  void rest() {
    for (; p_ < end_; p_ += 64) _mm_prefetch(reinterpret_cast<const char*>(p_), _mm_hint(Hint));
  }

 private:
  uintptr_t p_ = 0, end_ = 0;
};
using PacedPrefetch = PacedPrefetchTo<_MM_HINT_T0>;

// The query rows of an attend call prepared for q8_0 keys (kernels.h QueryQ8View), on the stack.
struct QueryQ8 {
  int8_t q[kAttendMaxRows * kAttendQ8MaxDim];
  float d[kAttendMaxRows * kAttendQ8MaxDim / 32];
  int32_t off[kAttendMaxRows * kAttendQ8MaxDim / 32];
  QueryQ8View view;
  QueryQ8(const float* qf, int rows, int64_t dk) : view{q, d, off, dk} { kv_quantize_query(qf, rows, dk, q, d, off); }
};

// The value rows of keys [lo, hi) of the key block at j0.
template <int Hint = _MM_HINT_T0>
PacedPrefetchTo<Hint> value_rows_prefetch(const AttendArgs& a, int64_t j0, int64_t lo, int64_t hi) {
  return PacedPrefetchTo<Hint>(a.v + size_t(j0 + lo) * a.v_row_stride, size_t(hi - lo) * a.v_row_stride);
}
// The `blocks` key blocks after the `blocks` from the one at j0 (fewer, or none, at the range's end).
template <int Hint = _MM_HINT_T0>
PacedPrefetchTo<Hint> next_key_block_prefetch(const AttendArgs& a, int64_t j0, int64_t blocks = 1) {
  const int64_t next = j0 / kKvKeyBlock + blocks, left = (a.n + kKvKeyBlock - 1) / kKvKeyBlock - next;
  if (left <= 0) return {};
  return PacedPrefetchTo<Hint>(a.k + size_t(next) * a.k_block_stride, size_t(std::min(blocks, left)) * a.k_block_stride);
}

// exp(x) for 8 lanes: as ../avx512/exp512.h's exp16 (the same polynomial in 256-bit vectors); 2^n built in the exponent field (n clamped to [-126, 127]).
inline __m256 exp8(__m256 x) {
  const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}


inline float hsum(__m128 v) {
  v = _mm_add_ps(v, _mm_movehl_ps(v, v));
  return _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
}
inline float hsum(__m256 v) {
  return hsum(_mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)));
}
inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

// Q4_K / Q5_K: the 6-bit scales and mins of the 8 sub-blocks from the 12 packed bytes at
// `packed`, as bytes [sc0 .. sc7, m0 .. m7] (scale_min_k4 of quant_ref.h):
//   j < 4:  sc = q[j] & 63,                           m = q[j + 4] & 63
//   j >= 4: sc = (q[j + 4] & 15) | (q[j - 4] >> 6) << 4, m = (q[j + 4] >> 4) | (q[j] >> 6) << 4
// Reads 16 bytes (the 12 and the first 4 quant bytes of the same block).
inline __m128i unpack_scales_mins_k4(const uint8_t* packed) {
  const __m128i q = load16(packed);
  // low parts come from x = [q0..q3, q8..q11, q4..q7, q8..q11], high parts from
  // y = [q0..q3, q0..q3, q4..q7, q4..q7]
  const __m128i x = _mm_shuffle_epi8(q, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
  const __m128i y = _mm_shuffle_epi8(q, _mm_setr_epi8(0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7, 4, 5, 6, 7));
  const __m128i low_mask = _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0);
  const __m128i nib_mask = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15);
  const __m128i top_mask = _mm_setr_epi8(0, 0, 0, 0, 48, 48, 48, 48, 0, 0, 0, 0, 48, 48, 48, 48);
  const __m128i low = _mm_or_si128(_mm_and_si128(x, low_mask), _mm_and_si128(_mm_srli_epi16(x, 4), nib_mask));
  return _mm_or_si128(low, _mm_and_si128(_mm_srli_epi16(y, 2), top_mask));  // (q >> 6) << 4
}

// Q4_K / Q5_K: sum over sub-blocks s of m_s * (bsums[2s] + bsums[2s + 1]), as 8 int32 (lane s),
// from unpack_scales_mins_k4's bytes.
inline __m256i mins_dot_bsums(__m128i scales_mins, const int16_t* bsums) {
  const __m128i pairs = _mm_shuffle_epi8(scales_mins, _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15));
  return _mm256_madd_epi16(_mm256_cvtepu8_epi16(pairs), load32(bsums));
}

// The two fp16 scales at p (d, then dmin) times the activation scale: [d * ad, dmin * ad, 0, 0].
inline __m128 two_halves_times(const uint16_t* p, float ad) {
  uint32_t both;
  std::memcpy(&both, p, 4);
  return _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(int(both))), _mm_set1_ps(ad));
}

}  // namespace
}  // namespace strata::cpu
