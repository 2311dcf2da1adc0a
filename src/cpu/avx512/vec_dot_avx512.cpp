// AVX-512 (F, BW, VL, DQ) + VNNI variants of the quantized dot products (kernels.h): Q4_0, Q5_0,
// Q8_0, IQ4_NL, MXFP4 against Q8_0 activations; Q4_K, Q5_K, Q6_K against Q8_K activations. Same
// signature and contract as the references of quant_ref.h (n a whole number of blocks, which the
// loader guarantees; not re-checked here). The Q8_K activation quantizer is here too; Q8_0's of
// the AVX2 directory serves this ISA.
//
// Math. As in the AVX2 variants the integer part is the reference's, exactly; the float part
// differs by rounding only:
//  - 32-element formats: two blocks per 512-bit register, products summed by vpdpbusd (u8 x s8,
//    four at a time, into int32 lanes: 8 lanes per block), each block's lanes scaled by its float
//    scale and accumulated in 16 float lanes.
//  - K formats: 64 elements per register in element order, u8 quants x s8 activations summed in
//    pairs by vpmaddubsw (no saturation at these ranges, see vec_dot_avx2.cpp), then weighted by
//    the int16 sub-block scales and accumulated in int32 by vpdpwssd; one float FMA per
//    super-block.
//
// Where the CPU also has VBMI, vbmi/vec_dot_vbmi.cpp replaces the MXFP4, Q4_0 and IQ4_NL variants
// (fewer instructions per block); these remain for AVX-512 CPUs without it (Cascade Lake).
//
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mfma -mf16c; called only
// when the CPU has them. No inline function or template of the shared headers is used here (see
// ../avx2/simd_common.h).

// GCC 12's avx512fintrin.h initialises its "undefined" vectors from themselves (GCC PR 105593),
// which -Wuninitialized then reports at every inlined use; fixed in GCC 13.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cpu/avx2/simd_common.h"
#include "cpu/kernels.h"
#include "cpu/quant_blocks.h"

namespace strata::cpu {
namespace {

inline __m512i load64(const void* p) { return _mm512_loadu_si512(p); }

// Two 32-byte rows side by side (the second by a masked broadcast: one shuffle-free merge).
inline __m512i load_32x2(const void* p0, const void* p1) {
  return _mm512_mask_broadcast_i64x4(_mm512_castsi256_si512(load32(p0)), 0xF0, load32(p1));
}

// ---- 32-element formats x Q8_0, four blocks per step, two per register ----
//
// Cost per block is what limits these formats (a block is only 17 to 34 bytes), so each step does
// the least it can: nibbles of two blocks spread by broadcasts and one masked shift; unsigned
// quants (codebooks shifted by an offset to be unsigned) straight into vpdpbusd, with the offset
// times the activations' sum (a second vpdpbusd) subtracted; the four blocks' float scales
// converted together in one register.

// The 64 nibbles of two 32-element blocks in element order: [b0 low, b0 high, b1 low, b1 high]
// (low nibbles are elements 0..15 of a block, high nibbles 16..31).
inline __m512i nibbles_32x2(const uint8_t* qs0, const uint8_t* qs1) {
  __m512i z = _mm512_broadcast_i32x4(load16(qs0));                // [qs0 qs0 qs0 qs0]
  z = _mm512_mask_broadcast_i32x4(z, 0xFF00, load16(qs1));        // [qs0 qs0 qs1 qs1]
  z = _mm512_mask_srli_epi16(z, 0xFF00FF00u, z, 4);                // [qs0 qs0>>4 qs1 qs1>>4]
  return _mm512_and_si512(z, _mm512_set1_epi8(0x0F));
}

// sum over groups of four bytes of (u - offset) * y, u unsigned, y signed: u * y by vpdpbusd,
// minus offset * sum(y).
inline __m512i dot_u8_offset(__m512i u, __m512i y, __m512i offset) {
  const __m512i uy = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, y);
  return _mm512_sub_epi32(uy, _mm512_dpbusd_epi32(_mm512_setzero_si512(), offset, y));
}

// sum over groups of four of x * y, both signed (x may be -128, y must not be).
inline __m512i dot_s8(__m512i x, __m512i y) {
  const __m512i sy = _mm512_mask_sub_epi8(y, _mm512_movepi8_mask(x), _mm512_setzero_si512(), y);
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(x), sy);
}

// The 16-bit words at byte offsets 0, S, 2S, 3S of p (the scales of four consecutive blocks of S
// bytes), zero-extended into the four 32-bit lanes of an xmm, with one or two 64-byte loads and
// one word permute. Reads only [p, p + 4S): the second load, where one is needed, ends inside the
// fourth block.
template <int S>
struct Words4 {
  static_assert(S % 2 == 0 && 4 * S >= 64 && 3 * S + 2 <= 128, "block stride outside the scheme");
  static constexpr int kSecond = 4 * S - 64 < 64 ? 4 * S - 64 : 64;  // offset of the second load
  static constexpr bool kOneLoad = 3 * S + 2 <= 64;
  struct Index {
    alignas(64) int16_t v[32];
  };
  static constexpr Index make_index() {
    Index t{};
    for (int k = 0; k < 4; ++k) {
      const int off = k * S;
      t.v[2 * k] = int16_t(off + 2 <= 64 ? off / 2 : 32 + (off - kSecond) / 2);
    }
    return t;
  }
  static constexpr Index kIndex = make_index();
  static_assert(kOneLoad || ((3 * S - kSecond) % 2 == 0 && 3 * S >= kSecond));
  static_assert(kOneLoad || 2 * S + 2 <= 64 || ((2 * S - kSecond) % 2 == 0 && 2 * S >= kSecond));

  static __m128i load(const void* p) {
    const __m512i idx = _mm512_load_si512(kIndex.v);
    const auto* b = static_cast<const uint8_t*>(p);
    if constexpr (kOneLoad) {
      return _mm512_castsi512_si128(_mm512_maskz_permutexvar_epi16(0x55, idx, load64(b)));
    } else {
      return _mm512_castsi512_si128(_mm512_maskz_permutex2var_epi16(0x55, load64(b), idx, load64(b + kSecond)));
    }
  }
};

// The fp16 scales of four consecutive blocks of S bytes whose first field is d, as 4 floats.
template <int S>
inline __m128 halves_x4(const void* first_block) {
  return _mm_cvtph_ps(_mm_packus_epi32(Words4<S>::load(first_block), _mm_setzero_si128()));
}

// Each format: the int32 lanes of two blocks' integer dot products (8 lanes per block), the float
// scales of four blocks, and one block's scale (for the tail).
template <class B>
struct HalfScaled {
  using Block = B;
  static_assert(offsetof(B, d) == 0);
  static __m128 scales4(const Block* w) { return halves_x4<sizeof(Block)>(w); }
  static float scale(const Block& b) { return half_to_float(b.d); }
};
struct Q8_0 : HalfScaled<block_q8_0> {
  static __m512i dot2(const Block& w0, const Block& w1, __m512i a) {
    return dot_s8(load_32x2(w0.qs, w1.qs), a);
  }
};
struct Q4_0 : HalfScaled<block_q4_0> {
  static __m512i dot2(const Block& w0, const Block& w1, __m512i a) {
    return dot_u8_offset(nibbles_32x2(w0.qs, w1.qs), a, _mm512_set1_epi8(8));
  }
};
struct Q5_0 : HalfScaled<block_q5_0> {
  static __m512i dot2(const Block& w0, const Block& w1, __m512i a) {
    uint32_t h0, h1;
    std::memcpy(&h0, w0.qh, 4);
    std::memcpy(&h1, w1.qh, 4);
    // the fifth bit of element j of a block is bit j of its qh: stored value 0..31, offset 16
    const __mmask64 high = _cvtu64_mask64(uint64_t(h0) | (uint64_t(h1) << 32));
    const __m512i nib = nibbles_32x2(w0.qs, w1.qs);
    const __m512i q = _mm512_mask_add_epi8(nib, high, nib, _mm512_set1_epi8(16));
    return dot_u8_offset(q, a, _mm512_set1_epi8(16));
  }
};
struct Iq4Nl : HalfScaled<block_iq4_nl> {
  static __m512i dot2(const Block& w0, const Block& w1, __m512i a) {
    // codebook + 127: 0..240
    const __m512i table = _mm512_broadcast_i32x4(_mm_add_epi8(load16(kvalues_iq4nl), _mm_set1_epi8(127)));
    const __m512i u = _mm512_shuffle_epi8(table, nibbles_32x2(w0.qs, w1.qs));
    return dot_u8_offset(u, a, _mm512_set1_epi8(127));
  }
};
struct Mxfp4 {
  using Block = block_mxfp4;
  static __m512i dot2(const Block& w0, const Block& w1, __m512i a) {
    // codebook + 12: 0..24
    const __m512i table = _mm512_broadcast_i32x4(_mm_add_epi8(load16(kvalues_mxfp4), _mm_set1_epi8(12)));
    const __m512i u = _mm512_shuffle_epi8(table, nibbles_32x2(w0.qs, w1.qs));
    return dot_u8_offset(u, a, _mm512_set1_epi8(12));
  }
  // 2^(e - 128) for the exponent bytes of four blocks, exact for every e (scalef reaches the
  // subnormal results 2^-128 and 2^-127 exactly). Byte k * 17 is the low (k even) or high (k odd)
  // byte of word 0, 8, 17, 25 of the first 64 bytes.
  static __m128 scales4(const Block* w) {
    static_assert(sizeof(Block) == 17 && offsetof(Block, e) == 0);
    const __m512i idx = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,  //
                                         0, 0, 0, 0, 0, 0, 0, 0, 0, 25, 0, 17, 0, 8, 0, 0);
    const __m128i words = _mm512_castsi512_si128(_mm512_maskz_permutexvar_epi16(0x55, idx, load64(w)));
    const __m128i e = _mm_and_si128(_mm_srlv_epi32(words, _mm_setr_epi32(0, 8, 0, 8)), _mm_set1_epi32(0xFF));
    const __m128 exponent = _mm_sub_ps(_mm_cvtepi32_ps(e), _mm_set1_ps(128.0f));
    return _mm_scalef_ps(_mm_set1_ps(1.0f), exponent);
  }
  static float scale(const Block& b) { return e8m0_half(b.e); }
};

template <class F>
float vec_dot_32(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const typename F::Block*>(vw);
  const auto* a = static_cast<const block_q8_0*>(va);
  const int64_t nb = n / 32;
  // lane l of the scale register of blocks (0, 1) is scale l / 8, of blocks (2, 3) 2 + l / 8
  const __m512i spread01 = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i spread23 = _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 4 <= nb; i += 4) {
    const __m128 d4 = _mm_mul_ps(F::scales4(w + i), halves_x4<sizeof(block_q8_0)>(a + i));
    const __m512 d = _mm512_castps128_ps512(d4);
    const __m512i p0 = F::dot2(w[i], w[i + 1], load_32x2(a[i].qs, a[i + 1].qs));
    const __m512i p1 = F::dot2(w[i + 2], w[i + 3], load_32x2(a[i + 2].qs, a[i + 3].qs));
    acc0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(spread01, d), _mm512_cvtepi32_ps(p0), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(spread23, d), _mm512_cvtepi32_ps(p1), acc1);
  }
  for (; i < nb; ++i) {
    // one block: the second half of the register is block i again, with scale 0
    const __m512i p = F::dot2(w[i], w[i], load_32x2(a[i].qs, a[i].qs));
    const float d = F::scale(w[i]) * half_to_float(a[i].d);
    const __m512 d2 = _mm512_maskz_mov_ps(0x00FF, _mm512_set1_ps(d));
    acc0 = _mm512_fmadd_ps(d2, _mm512_cvtepi32_ps(p), acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

// ---- K formats x Q8_K ----

// vpermw indices: lane l (0..31) selects int16 entry s + l / group, the scale of the lane's
// sub-block. Q4_K / Q5_K (group 16: a sub-block of 32 elements is 16 lanes of pairs):
// s = 2h for chunk h; Q6_K (group 8: 16 elements): s = 4g for the g-th 64 elements.
struct ScaleIndex {
  alignas(64) int16_t k4[4][32];
  alignas(64) int16_t k6[4][32];
};
constexpr ScaleIndex make_scale_index() {
  ScaleIndex t{};
  for (int g = 0; g < 4; ++g) {
    for (int l = 0; l < 32; ++l) {
      t.k4[g][l] = int16_t(2 * g + l / 16);
      t.k6[g][l] = int16_t(4 * g + l / 8);
    }
  }
  return t;
}
alignas(64) constexpr ScaleIndex kScaleIndex = make_scale_index();

// Q4_K / Q5_K: the 64 4-bit fields of chunk h (qs[32h .. 32h + 32)) in element order: the low
// nibbles (sub-block 2h) in bytes 0..31, the high nibbles (sub-block 2h + 1) in bytes 32..63.
inline __m512i nibbles_64(const uint8_t* qs) {
  const __m512i q = _mm512_broadcast_i64x4(load32(qs));
  return _mm512_and_si512(_mm512_mask_srli_epi16(q, 0xFFFF0000u, q, 4), _mm512_set1_epi8(0x0F));
}

template <bool kFifthBit, class Block>
float vec_dot_q45_K(int64_t n, const Block* w, const block_q8_K* a) {
  const int64_t nb = n / QK_K;
  __m512i idx[4];
  for (int h = 0; h < 4; ++h) idx[h] = _mm512_load_si512(kScaleIndex.k4[h]);
  __m512 acc = _mm512_setzero_ps();
  __m256 acc_m = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const __m128 dm = two_halves_times(&w[i].d, a[i].d);  // [d, dmin] * d_a
    const __m128i scales_mins = unpack_scales_mins_k4(w[i].scales);
    acc_m = _mm256_fnmadd_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(dm)),
                             _mm256_cvtepi32_ps(mins_dot_bsums(scales_mins, a[i].bsums)), acc_m);
    const __m512i scales = _mm512_castsi128_si512(_mm_cvtepu8_epi16(scales_mins));  // int16 sc0..sc7
    __m512i qh;
    if constexpr (kFifthBit) qh = _mm512_broadcast_i64x4(load32(w[i].qh));
    __m512i sumi = _mm512_setzero_si512();
    for (int h = 0; h < QK_K / 64; ++h) {
      __m512i q = nibbles_64(w[i].qs + 32 * h);
      if constexpr (kFifthBit) {
        // fifth bit of element e is bit e / 32 of qh[e % 32]: bit 2h for bytes 0..31, 2h + 1 above
        const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8(char(1 << (2 * h))),
                                               _mm256_set1_epi8(char(1 << (2 * h + 1))), 1);
        q = _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(qh, bit), q, _mm512_set1_epi8(16));
      }
      const __m512i p = _mm512_maddubs_epi16(q, load64(a[i].qs + 64 * h));
      sumi = _mm512_dpwssd_epi32(sumi, p, _mm512_permutexvar_epi16(idx[h], scales));
    }
    acc = _mm512_fmadd_ps(_mm512_broadcastss_ps(dm), _mm512_cvtepi32_ps(sumi), acc);
  }
  return _mm512_reduce_add_ps(acc) + hsum(acc_m);
}

float vec_dot_q4_K_q8_K(int64_t n, const void* w, const void* a) {
  return vec_dot_q45_K<false>(n, static_cast<const block_q4_K*>(w), static_cast<const block_q8_K*>(a));
}
float vec_dot_q5_K_q8_K(int64_t n, const void* w, const void* a) {
  return vec_dot_q45_K<true>(n, static_cast<const block_q5_K*>(w), static_cast<const block_q8_K*>(a));
}

float vec_dot_q6_K_q8_K(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const block_q6_K*>(vw);
  const auto* a = static_cast<const block_q8_K*>(va);
  const int64_t nb = n / QK_K;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i m30 = _mm512_set1_epi8(0x30);
  // per-16-bit shift counts moving the high bits 2k..2k+1 of qh to bits 4..5:
  // k = 0 | 1 (bytes 0..31 | 32..63 of the low-nibble register): << 4 | << 2,
  // k = 2 | 3 (high-nibble register): >> 0 | >> 2
  const __m512i shl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
  const __m512i shr = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1);
  __m512i idx[4];
  for (int g = 0; g < 4; ++g) idx[g] = _mm512_load_si512(kScaleIndex.k6[g]);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const float d = a[i].d * half_to_float(w[i].d);
    const __m256i sc16 = _mm256_cvtepi8_epi16(load16(w[i].scales));
    // The quants are stored as q + 32 (0..63): sum sc * (q + 32) * a, then subtract
    // 32 * sum over sub-blocks of sc * bsums.
    const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(sc16, load32(a[i].bsums)), 5);
    const __m512i scales = _mm512_castsi256_si512(sc16);
    __m512i sumi = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      // elements 128h + 0..63 are the low nibbles of ql[64h .. 64h + 64), 128h + 64..127 the
      // high nibbles; the high bits of element 128h + 32k + l are bits 2k..2k+1 of qh[32h + l]
      const __m512i ql = load64(w[i].ql + 64 * h);
      const __m512i qh = _mm512_broadcast_i64x4(load32(w[i].qh + 32 * h));
      const __m512i q0 = _mm512_or_si512(_mm512_and_si512(ql, m4),
                                         _mm512_and_si512(_mm512_sllv_epi16(qh, shl), m30));
      const __m512i q1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                         _mm512_and_si512(_mm512_srlv_epi16(qh, shr), m30));
      const __m512i p0 = _mm512_maddubs_epi16(q0, load64(a[i].qs + 128 * h));
      const __m512i p1 = _mm512_maddubs_epi16(q1, load64(a[i].qs + 128 * h + 64));
      sumi = _mm512_dpwssd_epi32(sumi, p0, _mm512_permutexvar_epi16(idx[2 * h], scales));
      sumi = _mm512_dpwssd_epi32(sumi, p1, _mm512_permutexvar_epi16(idx[2 * h + 1], scales));
    }
    sumi = _mm512_sub_epi32(sumi, _mm512_zextsi256_si512(offset));
    acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

// ---- activation quantizer, bit-identical to the reference for finite input ----

// Q8_K (quantize_row_q8_K of quant_ref.h), as the AVX2 one in 16-wide vectors: max = the first
// element of largest magnitude, iscale = -127 / max, q = min(round_half_even(iscale * x), 127)
// (vcvtps2dq in the default MXCSR mode), d = 1 / iscale; bsums by vpdpbusd against ones.
void quantize_row_q8_K(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<block_q8_K*>(vy);
  const int64_t nb = n / QK_K;
  const __m512i v127 = _mm512_set1_epi32(127), ones = _mm512_set1_epi8(1);
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    __m512 vmax = _mm512_setzero_ps();
    for (int e = 0; e < QK_K; e += 16) vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_loadu_ps(x + e)));
    const float amax = _mm512_reduce_max_ps(vmax);
    if (amax == 0.0f) {
      std::memset(&y[i], 0, sizeof(block_q8_K));
      continue;
    }
    // the first element of that magnitude gives the sign
    float max = amax;
    const __m512 vamax = _mm512_set1_ps(amax);
    for (int e = 0; e < QK_K; e += 16) {
      const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(x + e)), vamax, _CMP_EQ_OQ);
      if (hit) {
        max = x[e + __builtin_ctz(unsigned(hit))];
        break;
      }
    }
    const float iscale = -127.0f / max;
    const __m512 vscale = _mm512_set1_ps(iscale);
    alignas(64) int32_t sums[QK_K / 4];  // sums of 4 consecutive quants
    for (int e = 0; e < QK_K; e += 64) {
      __m128i q[4];
      for (int k = 0; k < 4; ++k) {
        const __m512i v = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(vscale, _mm512_loadu_ps(x + e + 16 * k))), v127);
        q[k] = _mm512_cvtsepi32_epi8(v);  // |v| <= 127: exact
      }
      const __m512i q64 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(q[1], q[0])), _mm256_set_m128i(q[3], q[2]), 1);
      _mm512_storeu_si512(y[i].qs + e, q64);
      _mm512_store_si512(sums + e / 4, _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, q64));
    }
    for (int j = 0; j < QK_K / 16; ++j)
      y[i].bsums[j] = int16_t(sums[4 * j] + sums[4 * j + 1] + sums[4 * j + 2] + sums[4 * j + 3]);
    y[i].d = 1.0f / iscale;
  }
}

}  // namespace

namespace detail {

void add_avx512_kernels(VecDotFn* vec_dot, QuantizeRowFn* quantize_row) {
  add_avx512_float_kernels(vec_dot);
  quantize_row[size_t(GgmlType::q8_k)] = quantize_row_q8_K;
  vec_dot[size_t(GgmlType::q4_0)] = vec_dot_32<Q4_0>;
  vec_dot[size_t(GgmlType::q5_0)] = vec_dot_32<Q5_0>;
  vec_dot[size_t(GgmlType::q8_0)] = vec_dot_32<Q8_0>;
  vec_dot[size_t(GgmlType::iq4_nl)] = vec_dot_32<Iq4Nl>;
  vec_dot[size_t(GgmlType::mxfp4)] = vec_dot_32<Mxfp4>;
  vec_dot[size_t(GgmlType::q4_k)] = vec_dot_q4_K_q8_K;
  vec_dot[size_t(GgmlType::q5_k)] = vec_dot_q5_K_q8_K;
  vec_dot[size_t(GgmlType::q6_k)] = vec_dot_q6_K_q8_K;
  // faster MXFP4 / Q4_0 / IQ4_NL where the CPU also has VBMI (vbmi/vec_dot_vbmi.cpp)
  if (__builtin_cpu_supports("avx512vbmi")) add_avx512_vbmi_kernels(vec_dot);
}

}  // namespace detail
}  // namespace strata::cpu
