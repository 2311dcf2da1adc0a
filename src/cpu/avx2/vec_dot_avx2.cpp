// AVX2 + FMA + F16C variants of the quantized dot products (kernels.h): Q4_0, Q5_0, Q8_0, IQ4_NL,
// MXFP4 against Q8_0 activations; Q4_K, Q5_K, Q6_K against Q8_K activations. Same signature and
// contract as the references of quant_ref.h (n a whole number of blocks, which the loader
// guarantees; not re-checked here).
//
// Math. The integer part is the reference's, exactly: per block the products of the quants are
// summed in int32 (_mm256_maddubs_epi16 pairs of u8 x s8, which cannot saturate at these ranges:
// at most 2 * 63 * 127 = 16002 for Q6_K, 2 * 128 * 127 for Q8_0), weighted by the integer
// sub-block scales. Only the float part differs: the block scale multiplies eight int32 lanes
// that are summed at the end (the reference sums the block's int32 first), and the rows' float
// accumulation is spread over lanes; the result differs from the reference by float rounding
// only (tests/test_simd_kernels.cpp).
//
// Compiled with -mavx2 -mfma -mf16c; called only when the CPU has them. Rule for this directory:
// no inline function or template from shared headers is used here (the compiler could emit an
// out-of-line copy built with these flags that the linker then picks for scalar code), so the
// half-float conversion and the MXFP4 scale are local.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu/kernels.h"
#include "cpu/quant_blocks.h"

namespace strata::cpu {
namespace {

inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

// 2^(e - 128): half the E8M0 value (as e8m0_to_f32_half in quant_blocks.h).
inline float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? (0x00200000u << e) : (uint32_t(e - 1) << 23);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float hsum(__m256 v) {
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m128i load16(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

// Sum of x * y over pairs of signed bytes, as 8 int32 (x may be -128, y must not be).
inline __m256i dot_i8(__m256i x, __m256i y) {
  const __m256i ax = _mm256_sign_epi8(x, x);  // |x| as u8 (128 stays 0x80 = 128)
  const __m256i sy = _mm256_sign_epi8(y, x);  // y with x's sign
  return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1));
}

// The 32 nibbles of a 32-element block in element order: low nibbles (elements 0..15), then
// high nibbles (16..31).
inline __m256i nibbles_32(const uint8_t* qs) {
  const __m128i t = load16(qs);
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0F));
}

// Byte j is 0xFF where bit j of the little-endian 32 bits at p is set, else 0 (ggml's
// bytes_from_bits_32).
inline __m256i bytes_from_bits_32(const uint8_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  const __m256i shuffle = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                            0x0101010101010101, 0x0000000000000000);
  __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(int(bits)), shuffle);
  bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}

// ---- 32-element formats x Q8_0 ----
// Two blocks per iteration into two accumulators (the FMA latency is the loop's critical path).

template <class Block, __m256i (*Quants)(const Block&), float (*Scale)(const Block&)>
float vec_dot_32(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const Block*>(vw);
  const auto* a = static_cast<const block_q8_0*>(va);
  const int64_t nb = n / 32;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    const __m256i p0 = dot_i8(Quants(w[i]), load32(a[i].qs));
    const __m256i p1 = dot_i8(Quants(w[i + 1]), load32(a[i + 1].qs));
    const float d0 = Scale(w[i]) * half_to_float(a[i].d);
    const float d1 = Scale(w[i + 1]) * half_to_float(a[i + 1].d);
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d0), _mm256_cvtepi32_ps(p0), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d1), _mm256_cvtepi32_ps(p1), acc1);
  }
  if (i < nb) {
    const __m256i p0 = dot_i8(Quants(w[i]), load32(a[i].qs));
    const float d0 = Scale(w[i]) * half_to_float(a[i].d);
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d0), _mm256_cvtepi32_ps(p0), acc0);
  }
  return hsum(_mm256_add_ps(acc0, acc1));
}

template <class Block>
float half_scale(const Block& b) { return half_to_float(b.d); }
float mxfp4_scale(const block_mxfp4& b) { return e8m0_half(b.e); }

__m256i quants_q8_0(const block_q8_0& b) { return load32(b.qs); }
__m256i quants_q4_0(const block_q4_0& b) {
  return _mm256_sub_epi8(nibbles_32(b.qs), _mm256_set1_epi8(8));
}
__m256i quants_q5_0(const block_q5_0& b) {
  // the nibble, minus 16 where the fifth bit is clear: OR-ing 0xF0 into a nibble is n - 16
  const __m256i high = _mm256_andnot_si256(bytes_from_bits_32(b.qh), _mm256_set1_epi8(char(0xF0)));
  return _mm256_or_si256(nibbles_32(b.qs), high);
}
__m256i quants_iq4_nl(const block_iq4_nl& b) {
  const __m256i table = _mm256_broadcastsi128_si256(load16(kvalues_iq4nl));
  return _mm256_shuffle_epi8(table, nibbles_32(b.qs));
}
__m256i quants_mxfp4(const block_mxfp4& b) {
  const __m256i table = _mm256_broadcastsi128_si256(load16(kvalues_mxfp4));
  return _mm256_shuffle_epi8(table, nibbles_32(b.qs));
}

// ---- K formats x Q8_K ----

// Q4_K / Q5_K: the 8 scales (bytes 0..7) and 8 mins (bytes 8..15) of the 12 packed bytes, as
// scale_min_k4 of quant_ref.h defines them (ggml's kmask unpacking).
inline __m128i unpack_scales_mins_k4(const uint8_t* packed) {
  constexpr uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
  uint32_t u[4];
  std::memcpy(u, packed, 12);
  u[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);
  const uint32_t mins_low = u[1] & kmask1;
  u[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);
  u[2] = mins_low;
  u[0] &= kmask1;
  return _mm_set_epi32(int(u[3]), int(u[2]), int(u[1]), int(u[0]));
}

// Q4_K / Q5_K: sum over sub-blocks s of min_s * (bsums[2s] + bsums[2s + 1]) as 4 int32.
inline __m128i mins_dot_bsums(__m256i scales_mins16, const int16_t* bsums) {
  const __m256i b = load32(bsums);
  const __m128i pairs = _mm_hadd_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
  return _mm_madd_epi16(_mm256_extracti128_si256(scales_mins16, 1), pairs);
}

// int16 scale `s` of 8 (in both 128-bit lanes of `scales16`) broadcast to all 16 lanes.
inline __m256i broadcast_scale(__m256i scales16, int s) {
  return _mm256_shuffle_epi8(scales16, _mm256_set1_epi16(short(((2 * s + 1) << 8) | (2 * s))));
}

float vec_dot_q4_K_q8_K(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const block_q4_K*>(vw);
  const auto* a = static_cast<const block_q8_K*>(va);
  const int64_t nb = n / QK_K;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256 acc = _mm256_setzero_ps();
  __m128 acc_m = _mm_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const float d = a[i].d * half_to_float(w[i].d);
    const float dmin = -a[i].d * half_to_float(w[i].dmin);
    const __m256i sm16 = _mm256_cvtepu8_epi16(unpack_scales_mins_k4(w[i].scales));
    acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(mins_dot_bsums(sm16, a[i].bsums)), acc_m);
    const __m128i sc128 = _mm256_castsi256_si128(sm16);
    const __m256i scales = _mm256_set_m128i(sc128, sc128);
    __m256i sumi = _mm256_setzero_si256();
    for (int h = 0; h < QK_K / 64; ++h) {
      // 64 elements: low nibbles are sub-block 2h, high nibbles sub-block 2h + 1
      const __m256i q = load32(w[i].qs + 32 * h);
      const __m256i lo = _mm256_and_si256(q, m4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      const __m256i plo = _mm256_maddubs_epi16(lo, load32(a[i].qs + 64 * h));
      const __m256i phi = _mm256_maddubs_epi16(hi, load32(a[i].qs + 64 * h + 32));
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(broadcast_scale(scales, 2 * h), plo));
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(broadcast_scale(scales, 2 * h + 1), phi));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
  }
  const __m128 m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
  return hsum(acc) + _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)));
}

float vec_dot_q5_K_q8_K(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const block_q5_K*>(vw);
  const auto* a = static_cast<const block_q8_K*>(va);
  const int64_t nb = n / QK_K;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i bit16 = _mm256_set1_epi8(16);
  __m256 acc = _mm256_setzero_ps();
  __m128 acc_m = _mm_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const float d = a[i].d * half_to_float(w[i].d);
    const float dmin = -a[i].d * half_to_float(w[i].dmin);
    const __m256i sm16 = _mm256_cvtepu8_epi16(unpack_scales_mins_k4(w[i].scales));
    acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(mins_dot_bsums(sm16, a[i].bsums)), acc_m);
    const __m128i sc128 = _mm256_castsi256_si128(sm16);
    const __m256i scales = _mm256_set_m128i(sc128, sc128);
    // fifth bit of element e is bit e / 32 of qh[e % 32]
    const __m256i qh = load32(w[i].qh);
    __m256i sumi = _mm256_setzero_si256();
    for (int h = 0; h < QK_K / 64; ++h) {
      const __m256i q = load32(w[i].qs + 32 * h);
      const __m256i blo = _mm256_set1_epi8(char(1 << (2 * h)));
      const __m256i bhi = _mm256_set1_epi8(char(1 << (2 * h + 1)));
      // min(qh & bit, 1) * 16 without a variable shift: compare, then AND with 16
      const __m256i hlo = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, blo), blo), bit16);
      const __m256i hhi = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bhi), bhi), bit16);
      const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), hlo);
      const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), hhi);
      const __m256i plo = _mm256_maddubs_epi16(lo, load32(a[i].qs + 64 * h));
      const __m256i phi = _mm256_maddubs_epi16(hi, load32(a[i].qs + 64 * h + 32));
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(broadcast_scale(scales, 2 * h), plo));
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(broadcast_scale(scales, 2 * h + 1), phi));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
  }
  const __m128 m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
  return hsum(acc) + _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)));
}

float vec_dot_q6_K_q8_K(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const block_q6_K*>(vw);
  const auto* a = static_cast<const block_q8_K*>(va);
  const int64_t nb = n / QK_K;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i m30 = _mm256_set1_epi8(0x30);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const float d = a[i].d * half_to_float(w[i].d);
    const __m128i scales = load16(w[i].scales);
    // The quants are stored as q + 32 (0..63): sum sc * (q + 32) * a, then subtract
    // 32 * sum over sub-blocks of sc * bsums.
    const __m256i offset = _mm256_madd_epi16(_mm256_cvtepi8_epi16(scales), load32(a[i].bsums));
    __m256i sumi = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = load32(w[i].ql + 64 * h);
      const __m256i ql1 = load32(w[i].ql + 64 * h + 32);
      const __m256i qh = load32(w[i].qh + 32 * h);
      // element 128h + 32k + l: k = 0, 1 low nibbles of ql0, ql1; k = 2, 3 high nibbles;
      // high bits 2k..2k+1 of qh moved to bits 4..5
      __m256i q[4];
      q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
      q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
      q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m30));
      q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                             _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
      for (int k = 0; k < 4; ++k) {
        const int s = 8 * h + 2 * k;  // sub-blocks s and s + 1 (16 elements each)
        const __m256i sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(
            scales, _mm_set_epi64x(0x0101010101010101ll * (s + 1), 0x0101010101010101ll * s)));
        const __m256i p = _mm256_maddubs_epi16(q[k], load32(a[i].qs + 128 * h + 32 * k));
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(sc, p));
      }
    }
    sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(offset, 5));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum(acc);
}

// ---- activation quantizers, bit-identical to the references for finite input ----

// Q8_K (quantize_row_q8_K of quant_ref.h): max = first element of largest magnitude,
// iscale = -127 / max, q = min(round_half_even(iscale * x), 127), d = 1 / iscale.
void quantize_row_q8_K(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<block_q8_K*>(vy);
  const int64_t nb = n / QK_K;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    __m256 vmax = _mm256_setzero_ps();
    for (int e = 0; e < QK_K; e += 8) vmax = _mm256_max_ps(vmax, _mm256_and_ps(_mm256_loadu_ps(x + e), abs_mask));
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float amax = _mm_cvtss_f32(m);
    if (amax == 0.0f) {
      std::memset(&y[i], 0, sizeof(block_q8_K));
      continue;
    }
    // the first element of that magnitude gives the sign
    float max = amax;
    const __m256 vamax = _mm256_set1_ps(amax);
    for (int e = 0; e < QK_K; e += 8) {
      const __m256 v = _mm256_loadu_ps(x + e);
      const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(v, abs_mask), vamax, _CMP_EQ_OQ));
      if (hit) {
        max = x[e + __builtin_ctz(unsigned(hit))];
        break;
      }
    }
    const float iscale = -127.0f / max;
    const __m256 vscale = _mm256_set1_ps(iscale);
    const __m256i v127 = _mm256_set1_epi32(127);
    // 32 elements per step: 4 x 8 int32 -> 32 int8 in element order
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    int32_t sums[QK_K / 4];  // sums of 4 consecutive quants
    for (int e = 0; e < QK_K; e += 32) {
      __m256i v[4];
      for (int k = 0; k < 4; ++k) {
        // cvtps rounds to nearest even in the default MXCSR mode, as nearbyint does
        v[k] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(vscale, _mm256_loadu_ps(x + e + 8 * k))), v127);
      }
      const __m256i p16a = _mm256_packs_epi32(v[0], v[1]);  // in-lane: 0-3 8-11 4-7 12-15
      const __m256i p16b = _mm256_packs_epi32(v[2], v[3]);
      const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b), order);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[i].qs + e), p8);
      const __m256i s4 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), p8), _mm256_set1_epi16(1));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(sums + e / 4), s4);
    }
    for (int j = 0; j < QK_K / 16; ++j)
      y[i].bsums[j] = int16_t(sums[4 * j] + sums[4 * j + 1] + sums[4 * j + 2] + sums[4 * j + 3]);
    y[i].d = 1.0f / iscale;
  }
}

// Q8_0 (quantize_row_q8_0 of quant_ref.h): d = amax / 127 stored as fp16 (round to nearest even),
// q = roundf(x * (1 / d)) (half away from zero).
void quantize_row_q8_0(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<block_q8_0*>(vy);
  const int64_t nb = n / QK8_0;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 sign_mask = _mm256_castsi256_ps(_mm256_set1_epi32(int(0x80000000u)));
  const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t i = 0; i < nb; ++i, x += QK8_0) {
    __m256 v[4];
    __m256 vmax = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_ps(x + 8 * k);
      vmax = _mm256_max_ps(vmax, _mm256_and_ps(v[k], abs_mask));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float d = _mm_cvtss_f32(m) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = uint16_t(_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));
    const __m256 vid = _mm256_set1_ps(id);
    __m256i q[4];
    for (int k = 0; k < 4; ++k) {
      // roundf: truncate, then step away from zero when the dropped fraction is >= 0.5 (the
      // subtraction is exact for |t| < 2^23)
      const __m256 t = _mm256_mul_ps(v[k], vid);
      const __m256 r = _mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
      const __m256 up = _mm256_cmp_ps(_mm256_and_ps(_mm256_sub_ps(t, r), abs_mask), half, _CMP_GE_OQ);
      const __m256 step = _mm256_and_ps(up, _mm256_or_ps(one, _mm256_and_ps(t, sign_mask)));
      q[k] = _mm256_cvttps_epi32(_mm256_add_ps(r, step));
    }
    const __m256i p16a = _mm256_packs_epi32(q[0], q[1]);
    const __m256i p16b = _mm256_packs_epi32(q[2], q[3]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[i].qs),
                        _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b), order));
  }
}

}  // namespace

namespace detail {

void add_avx2_kernels(VecDotFn* vec_dot, QuantizeRowFn* quantize_row) {
  vec_dot[size_t(GgmlType::q4_0)] = vec_dot_32<block_q4_0, quants_q4_0, half_scale<block_q4_0>>;
  vec_dot[size_t(GgmlType::q5_0)] = vec_dot_32<block_q5_0, quants_q5_0, half_scale<block_q5_0>>;
  vec_dot[size_t(GgmlType::q8_0)] = vec_dot_32<block_q8_0, quants_q8_0, half_scale<block_q8_0>>;
  vec_dot[size_t(GgmlType::iq4_nl)] =
      vec_dot_32<block_iq4_nl, quants_iq4_nl, half_scale<block_iq4_nl>>;
  vec_dot[size_t(GgmlType::mxfp4)] = vec_dot_32<block_mxfp4, quants_mxfp4, mxfp4_scale>;
  vec_dot[size_t(GgmlType::q4_k)] = vec_dot_q4_K_q8_K;
  vec_dot[size_t(GgmlType::q5_k)] = vec_dot_q5_K_q8_K;
  vec_dot[size_t(GgmlType::q6_k)] = vec_dot_q6_K_q8_K;
  quantize_row[size_t(GgmlType::q8_0)] = quantize_row_q8_0;
  quantize_row[size_t(GgmlType::q8_k)] = quantize_row_q8_K;
}

}  // namespace detail
}  // namespace strata::cpu
