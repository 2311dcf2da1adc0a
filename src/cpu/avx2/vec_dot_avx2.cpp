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
// Compiled with -mavx2 -mfma -mf16c; called only when the CPU has them. No inline function or
// template of the shared headers is used here (see simd_common.h).
#include <immintrin.h>

#include <algorithm>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cpu/avx2/simd_common.h"
#include "cpu/kernels.h"
#include "cpu/quant_blocks.h"

namespace strata::cpu {
namespace {

// Sum of x * y over pairs of signed bytes, as 8 int32 (x may be -128, y must not be).
inline __m256i dot_i8(__m256i x, __m256i y) {
  const __m256i ax = _mm256_sign_epi8(x, x);  // |x| as u8 (128 stays 0x80 = 128)
  const __m256i sy = _mm256_sign_epi8(y, x);  // y with x's sign
  return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1));
}

// ---- Q8_0 x Q8_0: one block per register, two blocks per iteration ----

float vec_dot_q8_0_q8_0(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const block_q8_0*>(vw);
  const auto* a = static_cast<const block_q8_0*>(va);
  const int64_t nb = n / 32;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    const __m256i p0 = dot_i8(load32(w[i].qs), load32(a[i].qs));
    const __m256i p1 = dot_i8(load32(w[i + 1].qs), load32(a[i + 1].qs));
    const float d0 = half_to_float(w[i].d) * half_to_float(a[i].d);
    const float d1 = half_to_float(w[i + 1].d) * half_to_float(a[i + 1].d);
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d0), _mm256_cvtepi32_ps(p0), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d1), _mm256_cvtepi32_ps(p1), acc1);
  }
  if (i < nb) {
    const __m256i p0 = dot_i8(load32(w[i].qs), load32(a[i].qs));
    const float d0 = half_to_float(w[i].d) * half_to_float(a[i].d);
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d0), _mm256_cvtepi32_ps(p0), acc0);
  }
  return hsum(_mm256_add_ps(acc0, acc1));
}

// ---- 4-bit formats x Q8_0: two blocks per register, four blocks per iteration ----
//
// A register holds the same half of two blocks: lo = [block 0 elements 0..15 | block 1 elements
// 0..15] (the low nibbles), hi = elements 16..31 (the high nibbles), so the nibbles need no
// cross-lane shuffle; the activations are loaded to match. Int32 lanes 0..3 are block 0's, 4..7
// block 1's. Four blocks' float scales are converted together.
//
// Quants are unsigned where vpmaddubsw allows it: the stored value q and an offset (Q4_0: 8,
// Q5_0: 16, MXFP4: its codebook shifted by 12), sum (q - offset) a = sum q a - sum offset a, both
// in int16 without saturation (at most 2 * 31 * 127 per pair, and twice that for the two halves).
// IQ4_NL's codebook (-127..113) would saturate that way and takes the sign trick of dot_i8.

struct Halves {
  __m256i lo, hi;
};

// The nibbles of two blocks' 16 quant bytes, as the lo / hi registers above.
inline Halves nibbles_2x32(const uint8_t* qs0, const uint8_t* qs1) {
  const __m256i t = _mm256_inserti128_si256(_mm256_castsi128_si256(load16(qs0)), load16(qs1), 1);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  return {_mm256_and_si256(t, m4), _mm256_and_si256(_mm256_srli_epi16(t, 4), m4)};
}

// The activations of two blocks as lo / hi registers.
inline Halves activations_2x32(const block_q8_0& a0, const block_q8_0& a1) {
  return {_mm256_inserti128_si256(_mm256_castsi128_si256(load16(a0.qs)), load16(a1.qs), 1),
          _mm256_inserti128_si256(_mm256_castsi128_si256(load16(a0.qs + 16)), load16(a1.qs + 16), 1)};
}

// The fifth bits of two Q5_0 blocks (bit j of qh: element j) as 0 / 16 bytes in the lo / hi
// layout: lo lane k holds bits 0..15 of block k's qh, hi lane k bits 16..31.
inline Halves fifth_bits_2x32(uint32_t qh0, uint32_t qh1) {
  const __m256i v = _mm256_set1_epi64x(int64_t(uint64_t(qh0) | (uint64_t(qh1) << 32)));
  // byte b of the 64 bits to bytes 8 (b % 2) .. 8 (b % 2) + 7 of the lane
  const __m256i lo = _mm256_shuffle_epi8(
      v, _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0404040404040404, 0x0505050505050505));
  const __m256i hi = _mm256_shuffle_epi8(
      v, _mm256_setr_epi64x(0x0202020202020202, 0x0303030303030303, 0x0606060606060606, 0x0707070707070707));
  const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201ull));
  const __m256i sixteen = _mm256_set1_epi8(16);
  return {_mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(lo, bit), bit), sixteen),
          _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hi, bit), bit), sixteen)};
}

// sum of (q - kOffset) * a over pairs of bytes, in int16, for unsigned q.
template <int kOffset>
inline __m256i dot_pairs_offset(__m256i q, __m256i a) {
  return _mm256_sub_epi16(_mm256_maddubs_epi16(q, a), _mm256_maddubs_epi16(_mm256_set1_epi8(kOffset), a));
}

inline __m256i pairs_to_int32(__m256i lo, __m256i hi) {
  return _mm256_madd_epi16(_mm256_add_epi16(lo, hi), _mm256_set1_epi16(1));
}

struct Q4_0 {
  using Block = block_q4_0;
  static __m256i dot2(const Block& w0, const Block& w1, const Halves& a) {
    const Halves q = nibbles_2x32(w0.qs, w1.qs);
    return pairs_to_int32(dot_pairs_offset<8>(q.lo, a.lo), dot_pairs_offset<8>(q.hi, a.hi));
  }
};
struct Q5_0 {
  using Block = block_q5_0;
  static __m256i dot2(const Block& w0, const Block& w1, const Halves& a) {
    Halves q = nibbles_2x32(w0.qs, w1.qs);
    uint32_t h0, h1;
    std::memcpy(&h0, w0.qh, 4);
    std::memcpy(&h1, w1.qh, 4);
    // stored value 0..31: the nibble plus 16 where the fifth bit is set; offset 16
    const Halves high = fifth_bits_2x32(h0, h1);
    q.lo = _mm256_or_si256(q.lo, high.lo);
    q.hi = _mm256_or_si256(q.hi, high.hi);
    return pairs_to_int32(dot_pairs_offset<16>(q.lo, a.lo), dot_pairs_offset<16>(q.hi, a.hi));
  }
};
struct Mxfp4 {
  using Block = block_mxfp4;
  static __m256i dot2(const Block& w0, const Block& w1, const Halves& a) {
    // codebook + 12: 0..24
    const __m256i table = _mm256_broadcastsi128_si256(_mm_add_epi8(load16(kvalues_mxfp4), _mm_set1_epi8(12)));
    const Halves q = nibbles_2x32(w0.qs, w1.qs);
    return pairs_to_int32(dot_pairs_offset<12>(_mm256_shuffle_epi8(table, q.lo), a.lo),
                          dot_pairs_offset<12>(_mm256_shuffle_epi8(table, q.hi), a.hi));
  }
};
struct Iq4Nl {
  using Block = block_iq4_nl;
  static __m256i dot2(const Block& w0, const Block& w1, const Halves& a) {
    const __m256i table = _mm256_broadcastsi128_si256(load16(kvalues_iq4nl));
    const Halves q = nibbles_2x32(w0.qs, w1.qs);
    return _mm256_add_epi32(dot_i8(_mm256_shuffle_epi8(table, q.lo), a.lo),
                            dot_i8(_mm256_shuffle_epi8(table, q.hi), a.hi));
  }
};

// The fp16 words at byte offsets 0, S, 2S, 3S of p (four consecutive blocks' d), as 4 floats.
template <int S>
inline __m128 halves_x4(const void* p) {
  const auto* b = static_cast<const uint8_t*>(p);
  uint16_t h[4];
  for (int k = 0; k < 4; ++k) std::memcpy(&h[k], b + k * S, 2);
  __m128i v = _mm_cvtsi32_si128(h[0]);
  v = _mm_insert_epi16(v, h[1], 1);
  v = _mm_insert_epi16(v, h[2], 2);
  v = _mm_insert_epi16(v, h[3], 3);
  return _mm_cvtph_ps(v);
}

// The float scales of four consecutive weight blocks, and of one.
template <class Block>
inline __m128 scales_x4(const Block* w) {
  static_assert(offsetof(Block, d) == 0);
  return halves_x4<sizeof(Block)>(w);
}
// MXFP4: 2^(e - 128). e << 23 is the float 2^(e - 127) for e >= 1, halved exactly (into the
// subnormal 2^-127 for e = 1); e = 0 gives 2^-128.
template <>
inline __m128 scales_x4<block_mxfp4>(const block_mxfp4* w) {
  const __m128i e = _mm_setr_epi32(w[0].e, w[1].e, w[2].e, w[3].e);
  const __m128 v = _mm_mul_ps(_mm_castsi128_ps(_mm_slli_epi32(e, 23)), _mm_set1_ps(0.5f));
  const __m128 e_zero = _mm_castsi128_ps(_mm_cmpeq_epi32(e, _mm_setzero_si128()));
  return _mm_blendv_ps(v, _mm_castsi128_ps(_mm_set1_epi32(0x00200000)), e_zero);
}
template <class Block>
inline float scale_of(const Block& b) { return half_to_float(b.d); }
template <>
inline float scale_of<block_mxfp4>(const block_mxfp4& b) { return e8m0_half(b.e); }

template <class F>
float vec_dot_4bit(int64_t n, const void* vw, const void* va) {
  using Block = typename F::Block;
  const auto* w = static_cast<const Block*>(vw);
  const auto* a = static_cast<const block_q8_0*>(va);
  const int64_t nb = n / 32;
  // lanes 0..3 take the scale of the register's first block, 4..7 of its second
  const __m256i spread01 = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
  const __m256i spread23 = _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 4 <= nb; i += 4) {
    const __m256 d = _mm256_castps128_ps256(_mm_mul_ps(scales_x4(w + i), halves_x4<sizeof(block_q8_0)>(a + i)));
    const __m256i p0 = F::dot2(w[i], w[i + 1], activations_2x32(a[i], a[i + 1]));
    const __m256i p1 = F::dot2(w[i + 2], w[i + 3], activations_2x32(a[i + 2], a[i + 3]));
    acc0 = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(d, spread01), _mm256_cvtepi32_ps(p0), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(d, spread23), _mm256_cvtepi32_ps(p1), acc1);
  }
  for (; i < nb; ++i) {
    // one block: block i twice, the second copy's lanes with scale 0
    const __m256i p = F::dot2(w[i], w[i], activations_2x32(a[i], a[i]));
    const float d = scale_of(w[i]) * half_to_float(a[i].d);
    acc0 = _mm256_fmadd_ps(_mm256_setr_ps(d, d, d, d, 0, 0, 0, 0), _mm256_cvtepi32_ps(p), acc0);
  }
  return hsum(_mm256_add_ps(acc0, acc1));
}

// ---- K formats x Q8_K ----

// int16 scale `s` of 8 (in both 128-bit lanes of `scales16`) broadcast to all 16 lanes.
inline __m256i broadcast_scale(__m256i scales16, int s) {
  return _mm256_shuffle_epi8(scales16, _mm256_set1_epi16(short(((2 * s + 1) << 8) | (2 * s))));
}

float vec_dot_q4_K_q8_K(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const block_q4_K*>(vw);
  const auto* a = static_cast<const block_q8_K*>(va);
  const int64_t nb = n / QK_K;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256 acc = _mm256_setzero_ps(), acc_m = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const __m128 dm = two_halves_times(&w[i].d, a[i].d);  // [d, dmin] * d_a
    const __m128i scales_mins = unpack_scales_mins_k4(w[i].scales);
    acc_m = _mm256_fnmadd_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(dm)),
                             _mm256_cvtepi32_ps(mins_dot_bsums(scales_mins, a[i].bsums)), acc_m);
    // the 8 scales as int16 in both 128-bit lanes
    const __m128i sc128 = _mm_cvtepu8_epi16(scales_mins);
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
    acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(dm), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum(_mm256_add_ps(acc, acc_m));
}

float vec_dot_q5_K_q8_K(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const block_q5_K*>(vw);
  const auto* a = static_cast<const block_q8_K*>(va);
  const int64_t nb = n / QK_K;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i bit16 = _mm256_set1_epi8(16);
  __m256 acc = _mm256_setzero_ps(), acc_m = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const __m128 dm = two_halves_times(&w[i].d, a[i].d);  // [d, dmin] * d_a
    const __m128i scales_mins = unpack_scales_mins_k4(w[i].scales);
    acc_m = _mm256_fnmadd_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(dm)),
                             _mm256_cvtepi32_ps(mins_dot_bsums(scales_mins, a[i].bsums)), acc_m);
    // the 8 scales as int16 in both 128-bit lanes
    const __m128i sc128 = _mm_cvtepu8_epi16(scales_mins);
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
    acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(dm), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum(_mm256_add_ps(acc, acc_m));
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

// ---- Q4_K / Q6_K x Q8_K for several tokens (a speculative verification step) ----
// Each super-block's quants are unpacked once for up to 8 tokens (more accumulators than ymm
// registers at 8: some live in L1; measured faster than passes of 4); every token's sums run exactly
// as in vec_dot_q4_K_q8_K / vec_dot_q6_K_q8_K (integer sums exact; the same float accumulators
// fed in the same order), so each result is bit-identical to that token's one-token dot.

// A sum the several-token kernels build step by step: without this barrier GCC reassociates the
// integer adds of every token and sub-block of a block into a tree, whose leaves (40 products for
// 5 tokens) spill to the stack and come back. No instruction: v merely has to be in a register here.
inline void keep_in_register(__m256i& v) { __asm__("" : "+x"(v)); }

template <int T>
void q4_K_tokens(int64_t nb, const block_q4_K* w, const uint8_t* a, size_t a_stride, float* y, int64_t ldy) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const block_q8_K* at[T];
  __m256 acc[T], acc_m[T];
  for (int t = 0; t < T; ++t) {
    at[t] = reinterpret_cast<const block_q8_K*>(a + size_t(t) * a_stride);
    acc[t] = acc_m[t] = _mm256_setzero_ps();
  }
  for (int64_t i = 0; i < nb; ++i) {
    const __m128i scales_mins = unpack_scales_mins_k4(w[i].scales);
    const __m128i sc128 = _mm_cvtepu8_epi16(scales_mins);
    const __m256i scales = _mm256_set_m128i(sc128, sc128);
    __m256i sumi[T];
    for (int t = 0; t < T; ++t) sumi[t] = _mm256_setzero_si256();
    for (int h = 0; h < QK_K / 64; ++h) {
      const __m256i q = load32(w[i].qs + 32 * h);
      const __m256i lo = _mm256_and_si256(q, m4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      const __m256i s_lo = broadcast_scale(scales, 2 * h), s_hi = broadcast_scale(scales, 2 * h + 1);
      for (int t = 0; t < T; ++t) {
        const __m256i plo = _mm256_maddubs_epi16(lo, load32(at[t][i].qs + 64 * h));
        const __m256i phi = _mm256_maddubs_epi16(hi, load32(at[t][i].qs + 64 * h + 32));
        sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(s_lo, plo));
        sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(s_hi, phi));
        keep_in_register(sumi[t]);
      }
    }
    for (int t = 0; t < T; ++t) {
      const __m128 dm = two_halves_times(&w[i].d, at[t][i].d);  // [d, dmin] * d_a
      acc_m[t] = _mm256_fnmadd_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(dm)),
                                  _mm256_cvtepi32_ps(mins_dot_bsums(scales_mins, at[t][i].bsums)), acc_m[t]);
      acc[t] = _mm256_fmadd_ps(_mm256_broadcastss_ps(dm), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = hsum(_mm256_add_ps(acc[t], acc_m[t]));
}

template <int T>
void q6_K_tokens(int64_t nb, const block_q6_K* w, const uint8_t* a, size_t a_stride, float* y, int64_t ldy) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i m30 = _mm256_set1_epi8(0x30);
  const block_q8_K* at[T];
  __m256 acc[T];
  for (int t = 0; t < T; ++t) {
    at[t] = reinterpret_cast<const block_q8_K*>(a + size_t(t) * a_stride);
    acc[t] = _mm256_setzero_ps();
  }
  for (int64_t i = 0; i < nb; ++i) {
    const __m128i scales = load16(w[i].scales);
    __m256i sumi[T];
    for (int t = 0; t < T; ++t) sumi[t] = _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = load32(w[i].ql + 64 * h);
      const __m256i ql1 = load32(w[i].ql + 64 * h + 32);
      const __m256i qh = load32(w[i].qh + 32 * h);
      __m256i q[4];
      q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
      q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
      q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m30));
      q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                             _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
      for (int k = 0; k < 4; ++k) {
        const int s = 8 * h + 2 * k;
        const __m256i sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(
            scales, _mm_set_epi64x(0x0101010101010101ll * (s + 1), 0x0101010101010101ll * s)));
        for (int t = 0; t < T; ++t) {
          const __m256i p = _mm256_maddubs_epi16(q[k], load32(at[t][i].qs + 128 * h + 32 * k));
          sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(sc, p));
          keep_in_register(sumi[t]);
        }
      }
    }
    const __m256i sc16 = _mm256_cvtepi8_epi16(scales);
    for (int t = 0; t < T; ++t) {
      const float d = at[t][i].d * half_to_float(w[i].d);
      const __m256i offset = _mm256_madd_epi16(sc16, load32(at[t][i].bsums));
      sumi[t] = _mm256_sub_epi32(sumi[t], _mm256_slli_epi32(offset, 5));
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = hsum(acc[t]);
}

// The VecDotTokensFn of a format: tokens in passes of up to kMaxPass.
constexpr int64_t kMaxPass = 8;
template <class Block, template <int> class Kernel>
void dot_tokens(int64_t n, const void* vw, const void* va, size_t a_stride, int64_t n_tok, float* y, int64_t ldy) {
  const auto* w = static_cast<const Block*>(vw);
  const auto* a = static_cast<const uint8_t*>(va);
  const int64_t nb = n / QK_K;
  // passes of up to kMaxPass tokens, balanced (9 tokens: 5 + 4, not 8 + 1)
  const int64_t passes = (n_tok + kMaxPass - 1) / kMaxPass;
  for (int64_t p = 0, t0 = 0; p < passes; ++p) {
    const int64_t count = (n_tok - t0) / (passes - p);
    const uint8_t* at = a + size_t(t0) * a_stride;
    float* yt = y + t0 * ldy;
    t0 += count;
    switch (count) {
      case 8: Kernel<8>::run(nb, w, at, a_stride, yt, ldy); break;
      case 7: Kernel<7>::run(nb, w, at, a_stride, yt, ldy); break;
      case 6: Kernel<6>::run(nb, w, at, a_stride, yt, ldy); break;
      case 5: Kernel<5>::run(nb, w, at, a_stride, yt, ldy); break;
      case 4: Kernel<4>::run(nb, w, at, a_stride, yt, ldy); break;
      case 3: Kernel<3>::run(nb, w, at, a_stride, yt, ldy); break;
      case 2: Kernel<2>::run(nb, w, at, a_stride, yt, ldy); break;
      default: Kernel<1>::run(nb, w, at, a_stride, yt, ldy); break;
    }
  }
}
template <int T>
struct Q4KTokens {
  static void run(int64_t nb, const block_q4_K* w, const uint8_t* a, size_t s, float* y, int64_t ldy) {
    q4_K_tokens<T>(nb, w, a, s, y, ldy);
  }
};
template <int T>
struct Q6KTokens {
  static void run(int64_t nb, const block_q6_K* w, const uint8_t* a, size_t s, float* y, int64_t ldy) {
    q6_K_tokens<T>(nb, w, a, s, y, ldy);
  }
};

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

void add_avx2_vec_dot_tokens(VecDotTokensFn* vec_dot_tokens) {
  vec_dot_tokens[size_t(GgmlType::q4_k)] = dot_tokens<block_q4_K, Q4KTokens>;
  vec_dot_tokens[size_t(GgmlType::q6_k)] = dot_tokens<block_q6_K, Q6KTokens>;
}

void add_avx2_kernels(VecDotFn* vec_dot, QuantizeRowFn* quantize_row) {
  add_avx2_float_kernels(vec_dot);
  vec_dot[size_t(GgmlType::q4_0)] = vec_dot_4bit<Q4_0>;
  vec_dot[size_t(GgmlType::q5_0)] = vec_dot_4bit<Q5_0>;
  vec_dot[size_t(GgmlType::q8_0)] = vec_dot_q8_0_q8_0;
  vec_dot[size_t(GgmlType::iq4_nl)] = vec_dot_4bit<Iq4Nl>;
  vec_dot[size_t(GgmlType::mxfp4)] = vec_dot_4bit<Mxfp4>;
  vec_dot[size_t(GgmlType::q4_k)] = vec_dot_q4_K_q8_K;
  vec_dot[size_t(GgmlType::q5_k)] = vec_dot_q5_K_q8_K;
  vec_dot[size_t(GgmlType::q6_k)] = vec_dot_q6_K_q8_K;
  quantize_row[size_t(GgmlType::q8_0)] = quantize_row_q8_0;
  quantize_row[size_t(GgmlType::q8_k)] = quantize_row_q8_K;
}

}  // namespace detail
}  // namespace strata::cpu
