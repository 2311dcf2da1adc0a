// AVX-512 VBMI variants of the 4-bit 32-element dot products against Q8_0 activations (kernels.h):
// MXFP4, Q4_0, IQ4_NL. Same signature and contract as the references of quant_ref.h (n a whole
// number of blocks). They replace the AVX-512 variants of vec_dot_avx512.cpp where the CPU also
// has VBMI (Ice Lake, Sapphire Rapids, Zen 4 / 5; not Skylake-X / Cascade Lake): registered by
// add_avx512_kernels after a run-time check, and compiled alone with -mavx512vbmi (src/CMakeLists.txt)
// so that no other kernel can pick up a VBMI instruction.
//
// Why. A block of these formats is 17 or 18 bytes, so per byte of weights they do twice the work
// of Q8_0, and the AVX-512 variants of vec_dot_avx512.cpp were compute-bound in the decode matvec
// (MXFP4 at about 0.55 of DRAM bandwidth with 2 threads). Per four blocks these do:
//  - weights: two 64-byte loads of the 68 / 72 bytes, one vpermb each to lay out two blocks'
//    nibbles as [b0 qs, b0 qs, b1 qs, b1 qs] (no 16-byte loads that split cache lines), a masked
//    shift for the high nibbles, and the codebook lookup as a vpermb whose 64-entry table repeats
//    the 16 values (it ignores index bits 6-7, and bits 4-5 select a copy: no AND);
//  - integers: unsigned values (the codebook plus an offset) straight into vpdpbusd, the offset
//    times the activations' sum (a second vpdpbusd) subtracted: exact, as in vec_dot_avx512.cpp;
//  - scales: the four weight scales taken from the first load by one permute, the four activation
//    scales from two loads by one permute, converted and multiplied in one xmm.
// Together about a quarter fewer instructions per block than vec_dot_avx512.cpp (measured on
// Zen 5: MXFP4 0.63 against 0.81 ns per block, 1 thread, weights in L2).
//
// Math: the integer sums are the reference's exactly; only the float scaling and accumulation
// order differ (tests/test_simd_kernels.cpp states the bound).
//
// No inline function or template of the shared headers is used here (see ../../avx2/simd_common.h).

// GCC 12's avx512fintrin.h initialises its "undefined" vectors from themselves (GCC PR 105593),
// which -Wuninitialized then reports at every inlined use; fixed in GCC 13.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "cpu/avx2/simd_common.h"
#include "cpu/kernels.h"
#include "cpu/quant_blocks.h"

namespace strata::cpu {
namespace {

inline __m512i load64(const void* p) { return _mm512_loadu_si512(p); }

// Two 32-byte rows side by side.
inline __m512i load_32x2(const void* p0, const void* p1) {
  return _mm512_mask_broadcast_i64x4(_mm512_castsi256_si512(load32(p0)), 0xF0, load32(p1));
}

// The permute indices of a format whose blocks are S bytes with the 16 quant bytes at offset Q, for
// four consecutive blocks read as two 64-byte loads, at 0 and at kSecond = 4S - 64.
template <int S, int Q>
struct NibbleLayout {
  static constexpr int kSecond = 4 * S - 64;
  static_assert(S >= 17 && Q + 16 <= S && kSecond >= 0 && 2 * S + Q >= kSecond, "outside the scheme");
  struct Index {
    alignas(64) uint8_t first[64];   // blocks 0, 1 from the first load: [qs0, qs0, qs1, qs1]
    alignas(64) uint8_t second[64];  // blocks 2, 3 from the second load
  };
  static constexpr Index make() {
    Index t{};
    for (int p = 0; p < 64; ++p) {
      const int k = p / 32, j = p % 16;
      t.first[p] = uint8_t(S * k + Q + j);
      t.second[p] = uint8_t(S * (k + 2) + Q + j - kSecond);
    }
    return t;
  }
  static constexpr Index kIndex = make();
};

// The fp16 scales of four consecutive Q8_0 blocks (words 0, 17, 34, 51 of the 128 bytes at the
// first block) as 4 floats.
inline __m128 activation_scales4(const block_q8_0* a) {
  const __m512i idx = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,  //
                                       0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 51, 34, 17, 0);
  const auto* b = reinterpret_cast<const uint8_t*>(a);
  return _mm_cvtph_ps(_mm512_castsi512_si128(_mm512_permutex2var_epi16(load64(b), idx, load64(b + 64))));
}

// The fp16 first fields of four consecutive S-byte blocks, from the first 64 bytes `first`.
template <int S>
inline __m128 halves4(__m512i first) {
  static_assert(S % 2 == 0 && 3 * S + 2 <= 64);
  const __m512i idx = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,  //
                                       0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3 * S / 2, S, S / 2, 0);
  return _mm_cvtph_ps(_mm512_castsi512_si128(_mm512_maskz_permutexvar_epi16(0x0F, idx, first)));
}

// Each format: its block, the offset added to make its values unsigned, the values of 64 nibble
// bytes (index in bits 0..3; bits 4..7 may hold anything), and the weight scales of four blocks
// times the activation scales `ad`, from the first 64 bytes of the blocks.
struct Mxfp4 {
  using Block = block_mxfp4;
  static constexpr int kOffset = 12;
  static __m512i values(__m512i nib) {
    // codebook + 12 (0..24), repeated over the 64 entries vpermb indexes with bits 0..5
    const __m512i table = _mm512_broadcast_i32x4(_mm_add_epi8(load16(kvalues_mxfp4), _mm_set1_epi8(kOffset)));
    return _mm512_permutexvar_epi8(nib, table);
  }
  // 2^(e - 128) * ad, exact but for the one rounding of the reference's product (scalef reaches
  // the subnormal results too). The exponent bytes are bytes 0, 17, 34, 51.
  static __m128 scales4(__m512i first, __m128 ad) {
    static_assert(sizeof(Block) == 17 && offsetof(Block, e) == 0);
    const __m512i idx = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 51, 34, 17, 0);
    const __m128i e = _mm512_castsi512_si128(_mm512_maskz_permutexvar_epi8(0x1111, idx, first));
    return _mm_scalef_ps(ad, _mm_sub_ps(_mm_cvtepi32_ps(e), _mm_set1_ps(128.0f)));
  }
  static float scale(const Block& b) { return e8m0_half(b.e); }
};
struct Q4_0 {
  using Block = block_q4_0;
  static constexpr int kOffset = 8;
  static __m512i values(__m512i nib) { return _mm512_and_si512(nib, _mm512_set1_epi8(0x0F)); }
  static __m128 scales4(__m512i first, __m128 ad) { return _mm_mul_ps(halves4<sizeof(Block)>(first), ad); }
  static float scale(const Block& b) { return half_to_float(b.d); }
};
struct Iq4Nl {
  using Block = block_iq4_nl;
  static constexpr int kOffset = 127;
  static __m512i values(__m512i nib) {
    // codebook + 127: 0..240
    const __m512i table = _mm512_broadcast_i32x4(_mm_add_epi8(load16(kvalues_iq4nl), _mm_set1_epi8(kOffset)));
    return _mm512_permutexvar_epi8(nib, table);
  }
  static __m128 scales4(__m512i first, __m128 ad) { return _mm_mul_ps(halves4<sizeof(Block)>(first), ad); }
  static float scale(const Block& b) { return half_to_float(b.d); }
};

// sum over groups of four bytes of (u - offset) * y: u * y by vpdpbusd, minus offset * sum(y).
template <int kOffset>
inline __m512i dot_u8_offset(__m512i u, __m512i y) {
  const __m512i uy = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, y);
  return _mm512_sub_epi32(uy, _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(kOffset), y));
}

// Nibble bytes laid out [b0 qs, b0 qs >> 4, b1 qs, b1 qs >> 4] (per 16-bit word) -> element order.
inline __m512i high_nibbles_down(__m512i q) { return _mm512_mask_srli_epi16(q, 0xFF00FF00u, q, 4); }

template <class F>
float vec_dot_vbmi(int64_t n, const void* vw, const void* va) {
  using Block = typename F::Block;
  using Layout = NibbleLayout<sizeof(Block), offsetof(Block, qs)>;
  const auto* w = static_cast<const Block*>(vw);
  const auto* a = static_cast<const block_q8_0*>(va);
  const int64_t nb = n / 32;
  const __m512i first_idx = _mm512_load_si512(Layout::kIndex.first);
  const __m512i second_idx = _mm512_load_si512(Layout::kIndex.second);
  // lane l of the scale register of blocks (0, 1) is scale l / 8, of blocks (2, 3) 2 + l / 8
  const __m512i spread01 = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i spread23 = _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 4 <= nb; i += 4) {
    const auto* wb = reinterpret_cast<const uint8_t*>(w + i);
    const __m512i first = load64(wb), second = load64(wb + Layout::kSecond);
    const __m512 d = _mm512_castps128_ps512(F::scales4(first, activation_scales4(a + i)));
    const __m512i u01 = F::values(high_nibbles_down(_mm512_permutexvar_epi8(first_idx, first)));
    const __m512i u23 = F::values(high_nibbles_down(_mm512_permutexvar_epi8(second_idx, second)));
    const __m512i p0 = dot_u8_offset<F::kOffset>(u01, load_32x2(a[i].qs, a[i + 1].qs));
    const __m512i p1 = dot_u8_offset<F::kOffset>(u23, load_32x2(a[i + 2].qs, a[i + 3].qs));
    acc0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(spread01, d), _mm512_cvtepi32_ps(p0), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(spread23, d), _mm512_cvtepi32_ps(p1), acc1);
  }
  for (; i < nb; ++i) {
    // one block (no 64-byte load may run past the row): its nibbles twice, the second copy's
    // lanes with scale 0
    const __m512i q = _mm512_broadcast_i32x4(load16(w[i].qs));
    const __m512i p = dot_u8_offset<F::kOffset>(F::values(high_nibbles_down(q)), load_32x2(a[i].qs, a[i].qs));
    const float d = F::scale(w[i]) * half_to_float(a[i].d);
    acc0 = _mm512_fmadd_ps(_mm512_maskz_mov_ps(0x00FF, _mm512_set1_ps(d)), _mm512_cvtepi32_ps(p), acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

}  // namespace

namespace detail {

void add_avx512_vbmi_kernels(VecDotFn* vec_dot) {
  vec_dot[size_t(GgmlType::mxfp4)] = vec_dot_vbmi<Mxfp4>;
  vec_dot[size_t(GgmlType::q4_0)] = vec_dot_vbmi<Q4_0>;
  vec_dot[size_t(GgmlType::iq4_nl)] = vec_dot_vbmi<Iq4Nl>;
}

}  // namespace detail
}  // namespace strata::cpu
