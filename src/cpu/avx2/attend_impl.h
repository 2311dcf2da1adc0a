// Decode attention kernels (kernels.h AttendFn) in 256-bit vectors, for each KV entry format,
// compiled by attend_avx2.cpp with the AVX2 flags (../avx512/attend_avx512.cpp has its own
// 512-bit kernels: 8 rows a pass in 32 registers). In an unnamed namespace, as simd_common.h.
//
// f32 / f16, per key block of 32 keys: the scores of up to 4 query rows by 16 keys at a time (8
// accumulators: each widened key vector feeds 4 rows), read straight from the cache entries
// (f16: F16C); the block's softmax step; then the output tiles of 4 rows by 16 value columns
// accumulated over the block's keys, value rows widened as they are read.
// q8_0: 8 rows a pass over two key blocks at a time, keys and values in integers (rows_block_q8
// below).
// Nothing is widened into memory, and the block's scores ([rows][32]; q8_0: the step's, [8][64])
// stay in L1.
// The first pass over a block paces the prefetches (simd_common.h PacedPrefetch): its scores
// loops bring in the block's value rows, its value loops the next key block.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>

#include "cpu/avx2/simd_common.h"
#include "cpu/kernels.h"
#include "cpu/kv_format.h"
#include "cpu/quant_blocks.h"

namespace strata::cpu {
namespace {

constexpr int64_t kAttendBlock = kKvKeyBlock;

// 8 consecutive entries at p as floats (f32, f16)
template <KvType T>
inline __m256 load8(const uint8_t* p) {
  static_assert(T == KvType::f32 || T == KvType::f16);
  if constexpr (T == KvType::f32) return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  else return _mm256_cvtph_ps(load16(p));
}
template <KvType T>
constexpr size_t entry_bytes() {
  return T == KvType::f32 ? 4 : 2;
}

// The largest of a step's scores sr[0 .. NB) over keys [lo, hi); the others set to -inf, so that
// the step's weights exp(s - max) are 0 there without a branch.
template <int64_t NB = kAttendBlock>
inline float live_max(float* sr, int64_t lo, int64_t hi) {
  std::fill(sr, sr + lo, -INFINITY);
  std::fill(sr + hi, sr + NB, -INFINITY);
  __m256 m = _mm256_max_ps(_mm256_loadu_ps(sr), _mm256_loadu_ps(sr + 8));
  for (int64_t j = 16; j < NB; j += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(sr + j));
  return hmax(m);
}

// ---- q8_0 entries in integers, 8 rows a pass ----
//
// A GQA group of 8 rows meets each key and value once: the 8 rows' accumulators fill 8 of the 16
// registers, the entry being read and its widened forms the rest.
//
// Scores: per 8 keys and group of 32 dims, per key dword (4 dims) `vpmaddubsw` of |k| against the
// row's 4 quants signed as k (|k| <= 128 and |q| <= 127: no int16 saturation), `vpmaddwd` to the
// keys' int32 sums; the exact group sums times the key's and the row's scales, added into s. The
// pass's query quants transposed once per call (QueryQ8T), so that the 8 rows' broadcasts come
// from one pointer: with a pointer a row GCC spilled the accumulators in the loop (3-5% a key).
// Each sum passes through opaque(): inlined into the two-block step, GCC hoisted the next dword's
// 8 broadcasts above the sums and spilled 3 accumulators a dword (43.6 -> 43.0 ns a key).
//
// Values: as the AVX-512 kernel's (../avx512/attend_avx512.cpp values_q8), a step (here two key
// blocks) at a time: its softmax weights times the value rows' scales, w_j = p_j d_j (p_j =
// exp(s_j - the step's max) <= 1), rounded to int16 against the step's largest scale (32767 w_j /
// dmax); then per two keys and 8 columns one `vpmaddwd` a row: the rows j and j + 1 interleaved
// byte by byte and widened to int16 pairs (values_q8_rows), against (w_j, w_j+1) broadcast from
// the row's pairs (one vpbroadcastd load, for 16 columns). Where widening to floats cost a
// conversion chain and an FMA a row for every key, twice for a group of 8, this is half an
// instruction a row per key. The rounding of w_j is at most 2^-16 of the step's largest weight
// (the values' own q8_0 step is 2^-7 of their block's largest).

// exp(x) of a block's scores less their max (x <= 0) for the q8_0 value weights, which are rounded
// to int16 (2^-15 of the block's largest) straight after: 5.4e-6 relative (e^r = 1 + r + r^2 p(r),
// p of degree 2 fitted to the relative error on |r| <= ln2 / 2), 2^n from the low mantissa bits of
// x log2(e) + 1.5 x 2^23 + 127 (one FMA for round, convert and add). x <= -87 (the -inf of keys
// outside the range) gives 2^-126: 0 as an int16 weight, and nothing in a sum that holds the
// block's max (exp(0) = 1 exactly). exp8 (1.2e-7) took 2.5% more of the kernel's time a key.
inline __m256 exp8_weights(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 magic = _mm256_set1_ps(12583039.0f);  // 0x4B40007F
  const __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), magic);
  const __m256 n = _mm256_sub_ps(t, magic);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(4.127774647e-2f), r, _mm256_set1_ps(1.675351395e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.000511603e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(t), 23)));
}

// The query rows of an 8-row pass transposed for scores_block_q8: qt[u][r] the 4 quants of dims 4u
// .. 4u + 3 of row r0 + r (rows past the pass's end 0), so that one pointer walks all 8 rows.
struct QueryQ8T {
  alignas(32) int32_t qt[kAttendQ8MaxDim / 4][8];
  QueryQ8T(const QueryQ8View& qq, int r0, int rows) {
    for (int64_t u = 0; u < qq.dk / 4; ++u)
      for (int r = 0; r < 8; ++r) {
        int32_t x = 0;
        if (r < rows) std::memcpy(&x, qq.q + (r0 + r) * qq.dk + u * 4, 4);
        qt[u][r] = x;
      }
  }
};

// s[r * lds + 0 .. 32) = q_r . K_j for rows r0 .. r0 + R of the query and the 32 keys of a q8_0
// key block; pf.step() dk times.
template <int R>
void scores_block_q8(const QueryQ8View& qq, const QueryQ8T& qt, int r0, const uint8_t* blk, float* s, int64_t lds,
                     PacedPrefetch& pf) {
  const int64_t dk = qq.dk, ng = dk / 32;
  const uint8_t* scales = blk + dk * kAttendBlock;  // halves [dk / 32][32]
  const __m256i flip = _mm256_set1_epi8(char(0x80)), ones = _mm256_set1_epi16(1);  // offset bytes -> int8
  for (int64_t c8 = 0; c8 < kAttendBlock; c8 += 8) {
    for (int64_t g = 0; g < ng; ++g) {
      __m256i acc[R];
      for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_si256();
      const uint8_t* kp = blk + size_t(g * 8 * kAttendBlock + c8) * 4;
      const int32_t* qp = qt.qt[g * 8];
#pragma GCC unroll 8
      for (int u = 0; u < 8; ++u, kp += kAttendBlock * 4, qp += 8) {
        const __m256i k = _mm256_xor_si256(load32(kp), flip);
        const __m256i ka = _mm256_abs_epi8(k);
        pf.step();
        for (int r = 0; r < R; ++r) {
          const __m256i qs = _mm256_sign_epi8(_mm256_set1_epi32(qp[r]), k);
          acc[r] = opaque(_mm256_add_epi32(acc[r], _mm256_madd_epi16(_mm256_maddubs_epi16(ka, qs), ones)));
        }
      }
      const __m256 ks = _mm256_cvtph_ps(load16(scales + size_t(g * kAttendBlock + c8) * 2));
      for (int r = 0; r < R; ++r) {
        float* sr = s + r * lds + c8;
        const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r]), _mm256_mul_ps(ks, _mm256_set1_ps(qq.d[(r0 + r) * ng + g])));
        _mm256_storeu_ps(sr, g == 0 ? t : _mm256_add_ps(_mm256_loadu_ps(sr), t));
      }
    }
  }
}

// o[r][32 b .. 32 b + 32) = o[r][..] corr[r] + scale[r] sum over keys j in [j_lo, hi) of w[r][j] v_j
// (value block b): wp [R][WS] dwords, wp[r][i] the int16 weights of row r for keys 2i and 2i + 1
// (0 outside the range), value rows at v (row_stride bytes apart), j_lo even. One
// loop with no tail: an odd last key pairs with the row after it at weight 0 (AttendArgs::v).
// Up to 4 rows by 16 columns at a time (values_q8_rows): each row's weight pair, broadcast once,
// meets two column vectors, so a key pair costs 6 loads for 8 vpmaddwd where 8 rows by 8 columns
// cost 10 (loads, not the multiplies, bounded that loop: 5% of the kernel's time a key on Zen 3).
// The pairs widened within 128-bit lanes: each row's 16 bytes broadcast to both lanes (a load),
// interleaved (vpunpck*bw), each byte moved to the high half of its word (vpshufb: lane 0 the pairs
// of columns 0-3, lane 1 of 4-7) and shifted down with its sign (vpsraw 8). vpmovsxbw, which
// crosses lanes, ran 0.8 a cycle on Zen 3 and took the vpmaddwd pipes with it: an asm loop of one
// step of 2 keys x 16 columns x 4 rows, 6.65 -> 5.9 cycles; the kernel 45.2 -> 43.6 ns a key.
// Out of line, as the AVX-512 kernel's (inlined there, GCC 12 spilled its accumulators).
template <int R, int WS>
inline void values_q8_rows(const int32_t* wp, const float* corr, const float* scale, int64_t j_lo, int64_t hi,
                           const uint8_t* qs, size_t row_stride, float* o, int64_t dv, PacedPrefetch& pf) {
  static_assert(R >= 1 && R <= 4);
  // word i of lane 0 takes byte i of its lane in its high half, word i of lane 1 byte 8 + i (the
  // low halves zero); both lanes hold the same 16 interleaved bytes
  const __m256i high = _mm256_setr_epi8(-1, 0, -1, 1, -1, 2, -1, 3, -1, 4, -1, 5, -1, 6, -1, 7,
                                        -1, 8, -1, 9, -1, 10, -1, 11, -1, 12, -1, 13, -1, 14, -1, 15);
  for (int64_t c = 0; c < 32; c += 16) {
    __m256i a0[R], a1[R];
    for (int r = 0; r < R; ++r) a0[r] = a1[r] = _mm256_setzero_si256();
    const uint8_t* row = qs + c;
    const int32_t* wj = wp + j_lo / 2;
    for (int64_t j = j_lo; j < hi; j += 2, row += 2 * row_stride, ++wj) {
      pf.step();
      const __m256i x0 = _mm256_broadcastsi128_si256(load16(row));
      const __m256i x1 = _mm256_broadcastsi128_si256(load16(row + row_stride));
      // (v_j[i], v_j+1[i]) in dword i: columns c .. c + 7, then c + 8 .. c + 15
      const __m256i p0 = _mm256_srai_epi16(_mm256_shuffle_epi8(_mm256_unpacklo_epi8(x0, x1), high), 8);
      const __m256i p1 = _mm256_srai_epi16(_mm256_shuffle_epi8(_mm256_unpackhi_epi8(x0, x1), high), 8);
      for (int r = 0; r < R; ++r) {
        const __m256i w = _mm256_set1_epi32(wj[r * WS]);
        a0[r] = _mm256_add_epi32(a0[r], _mm256_madd_epi16(p0, w));
        a1[r] = _mm256_add_epi32(a1[r], _mm256_madd_epi16(p1, w));
      }
    }
    for (int r = 0; r < R; ++r) {
      float* orow = o + r * dv + c;
      const __m256 sc = _mm256_set1_ps(scale[r]), cr = _mm256_set1_ps(corr[r]);
      const __m256 o0 = _mm256_mul_ps(_mm256_loadu_ps(orow), cr), o1 = _mm256_mul_ps(_mm256_loadu_ps(orow + 8), cr);
      _mm256_storeu_ps(orow, _mm256_fmadd_ps(_mm256_cvtepi32_ps(a0[r]), sc, o0));
      _mm256_storeu_ps(orow + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(a1[r]), sc, o1));
    }
  }
}

template <int R, int WS>
__attribute__((noinline)) void values_q8(const int32_t* wp, const float* corr, const float* scale, int64_t j_lo,
                                         int64_t hi, const uint8_t* v, size_t row_stride, int64_t b, float* o,
                                         int64_t dv, PacedPrefetch& pf) {
  const uint8_t* qs = v + size_t(j_lo) * row_stride + size_t(b) * sizeof(block_q8_0) + offsetof(block_q8_0, qs);
  o += 32 * b;
  values_q8_rows<(R < 4 ? R : 4), WS>(wp, corr, scale, j_lo, hi, qs, row_stride, o, dv, pf);
  if constexpr (R > 4)
    values_q8_rows<R - 4, WS>(wp + 4 * WS, corr + 4, scale + 4, j_lo, hi, qs, row_stride, o + 4 * dv, dv, pf);
}

// The value rows' scales (halves) of value block b for keys 8i .. 8i + 7 of a step, as floats (d:
// the block's scale in the step's first row), each read with vpinsrw (a 2-byte store of each and
// a vector load of eight cost a store-forwarding stall per load: 3 ns a key on Zen 3). Partial
// (keys outside [lo, hi) in the step): their rows are not read (the cache may end before the step
// does; unwritten slots may hold anything), the nearest key's scale stands in (their weights are
// 0, and the largest scale is the range's).
template <bool Partial>
inline __m256 value_scales8(const uint8_t* d, size_t row_stride, int64_t i, int64_t lo, int64_t hi) {
  const auto half = [&](int64_t j) -> int {
    if constexpr (Partial) j = std::clamp(j, lo, hi - 1);
    uint16_t h;
    std::memcpy(&h, d + size_t(j) * row_stride, 2);
    return h;
  };
  __m128i x = _mm_cvtsi32_si128(half(8 * i));
  x = _mm_insert_epi16(x, half(8 * i + 1), 1);
  x = _mm_insert_epi16(x, half(8 * i + 2), 2);
  x = _mm_insert_epi16(x, half(8 * i + 3), 3);
  x = _mm_insert_epi16(x, half(8 * i + 4), 4);
  x = _mm_insert_epi16(x, half(8 * i + 5), 5);
  x = _mm_insert_epi16(x, half(8 * i + 6), 6);
  x = _mm_insert_epi16(x, half(8 * i + 7), 7);
  return _mm256_cvtph_ps(x);
}

// rows_block for q8_0 entries, one step over NK consecutive key blocks (keys [lo, hi) of the
// NK * 32 from j0; NK = 2 wherever two blocks are left): integer scores, the softmax step against
// the step's own max, then each value block in integers (values_q8) over all the step's keys. Two
// blocks a step halve what each step costs besides its keys (the max, the weights' scaling, the
// value loops' start and their o rows): 51-52 -> 46 ns a key on Zen 3 (one thread, 8 rows, 512 keys
// in L2), and the int32 sums stay far from overflow (64 keys x 32767 x 128 < 2^28). R <= 8.
template <int R, int NK>
void rows_block_q8(const AttendArgs& a, const QueryQ8& qq, const QueryQ8T& qt, int r0, int64_t j0, int64_t lo,
                   int64_t hi) {
  static_assert(R >= 1 && R <= 8 && NK >= 1 && NK <= 2);
  constexpr int64_t NB = NK * kAttendBlock;  // keys a step
  const uint8_t* blk = a.k + size_t(j0 / kAttendBlock) * a.k_block_stride;
  const uint8_t* v = a.v + size_t(j0) * a.v_row_stride;
  const bool lead = r0 == 0;  // the pass that prefetches
  PacedPrefetch pf = lead ? value_rows_prefetch(a, j0, lo, hi) : PacedPrefetch();
  alignas(32) float sb[8 * NB];  // the step's scores, then its weights exp(s - max), [R][NB]
  for (int kb = 0; kb < NK; ++kb)
    scores_block_q8<R>(qq.view, qt, r0, blk + kb * a.k_block_stride, sb + kb * kAttendBlock, NB, pf);
  pf.rest();
  // per row: the step's max score bm over [lo, hi), m' = max(m, bm), the correction exp(m - m')
  // of what o holds, the step's factor e = exp(bm - m'), and its weights exp(s - bm) (0 outside)
  alignas(32) float bm[8] = {}, m_old[8] = {}, corr[8], e[8];
  for (int r = 0; r < R; ++r) {
    bm[r] = live_max<NB>(sb + r * NB, lo, hi);
    m_old[r] = a.m[r0 + r];
  }
  const __m256 bmv = _mm256_load_ps(bm), m_new = _mm256_max_ps(_mm256_load_ps(m_old), bmv);
  _mm256_store_ps(corr, exp8(_mm256_sub_ps(_mm256_load_ps(m_old), m_new)));
  _mm256_store_ps(e, exp8(_mm256_sub_ps(bmv, m_new)));
  alignas(32) float m_out[8];
  _mm256_store_ps(m_out, m_new);
  for (int r = 0; r < R; ++r) {
    float* sr = sb + r * NB;
    const __m256 mm = _mm256_set1_ps(bm[r]);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t j = 0; j < NB; j += 8) {
      const __m256 p = exp8_weights(_mm256_sub_ps(_mm256_loadu_ps(sr + j), mm));
      _mm256_storeu_ps(sr + j, p);
      sum = _mm256_add_ps(sum, p);
    }
    a.l[r0 + r] = a.l[r0 + r] * corr[r] + e[r] * hsum(sum);
    a.m[r0 + r] = m_out[r];
  }
  pf = lead ? next_key_block_prefetch(a, j0, NK) : PacedPrefetch();
  const int64_t j_lo = lo & ~int64_t(1);
  constexpr int WS = NB / 2;  // weight pairs a row
  alignas(32) int32_t wp[WS * R];
  float scale[8];
  for (int64_t b = 0; b < a.dv / 32; ++b) {
    const uint8_t* d = v + size_t(b) * sizeof(block_q8_0);
    __m256 dv[NB / 8];
    if (lo > 0 || hi < NB)
      for (int i = 0; i < NB / 8; ++i) dv[i] = value_scales8<true>(d, a.v_row_stride, i, lo, hi);
    else
      for (int i = 0; i < NB / 8; ++i) dv[i] = value_scales8<false>(d, a.v_row_stride, i, lo, hi);
    __m256 dm = dv[0];
    for (int i = 1; i < NB / 8; ++i) dm = _mm256_max_ps(dm, dv[i]);
    const float dmax = hmax(dm);
    const __m256 k = _mm256_set1_ps(dmax > 0 ? 32767.0f / dmax : 0.0f);
    for (int i = 0; i < NB / 8; ++i) dv[i] = _mm256_mul_ps(dv[i], k);
    for (int r = 0; r < R; ++r) {
      const float* pr = sb + r * NB;
      for (int i = 0; i < NB / 8; i += 2) {
        // keys 8i .. 8i + 15 as int16 pairs in dwords, in order (packs interleaves its sources by
        // 128-bit lane: pairs 0, 1, 4, 5 | 2, 3, 6, 7 of the 8, put back in order by vpermq)
        const __m256i w16 = _mm256_packs_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(pr + 8 * i), dv[i])),
                                               _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(pr + 8 * i + 8), dv[i + 1])));
        _mm256_store_si256(reinterpret_cast<__m256i*>(wp + r * WS + 4 * i), _mm256_permute4x64_epi64(w16, 0xD8));
      }
      scale[r] = e[r] * (dmax / 32767.0f);
    }
    values_q8<R, WS>(wp, corr, scale, j_lo, hi, v, a.v_row_stride, b, a.o + r0 * a.dv, a.dv, pf);
  }
  pf.rest();
}

// s[r][c .. c + 16) = q_r . K_j for the R rows of q ([R][dk]) and keys c .. c + 15 of the block
// (f32, f16); pf.step() dk times.
template <KvType T, int R>
void scores_tile(const float* q, int64_t dk, const uint8_t* blk, int64_t c, float* s, PacedPrefetch& pf) {
  constexpr size_t es = entry_bytes<T>();
  __m256 a0[R], a1[R];
  for (int r = 0; r < R; ++r) a0[r] = a1[r] = _mm256_setzero_ps();
  auto step = [&](int64_t d, __m256 k0, __m256 k1) {
    for (int r = 0; r < R; ++r) {
      const __m256 b = _mm256_broadcast_ss(q + r * dk + d);
      a0[r] = _mm256_fmadd_ps(b, k0, a0[r]);
      a1[r] = _mm256_fmadd_ps(b, k1, a1[r]);
    }
  };
  for (int64_t d = 0; d < dk; ++d) {
    const uint8_t* row = blk + size_t(d * kAttendBlock + c) * es;
    pf.step();
    step(d, load8<T>(row), load8<T>(row + 8 * es));
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(s + r * kAttendBlock + c, a0[r]);
    _mm256_storeu_ps(s + r * kAttendBlock + c + 8, a1[r]);
  }
}

// o[r][c0 .. c0 + 16) = o[r][..] corr[r] + sum over keys j in [lo, hi) of p[r][j] V_j: R rows,
// value rows of the block's keys at v (row_stride bytes apart).
template <KvType T, int R>
void values_tile(const float* p, const float* corr, int64_t lo, int64_t hi, const uint8_t* v, size_t row_stride,
                 int64_t c0, float* o, int64_t dv, PacedPrefetch& pf) {
  __m256 a0[R], a1[R];
  for (int r = 0; r < R; ++r) {
    const __m256 cr = _mm256_set1_ps(corr[r]);
    a0[r] = _mm256_mul_ps(_mm256_loadu_ps(o + r * dv + c0), cr);
    a1[r] = _mm256_mul_ps(_mm256_loadu_ps(o + r * dv + c0 + 8), cr);
  }
  for (int64_t j = lo; j < hi; ++j) {
    const uint8_t* row = v + size_t(j) * row_stride;
    pf.step();
    constexpr size_t es = entry_bytes<T>();
    const __m256 v0 = load8<T>(row + size_t(c0) * es), v1 = load8<T>(row + size_t(c0 + 8) * es);
    for (int r = 0; r < R; ++r) {
      const __m256 b = _mm256_broadcast_ss(p + r * kAttendBlock + j);
      a0[r] = _mm256_fmadd_ps(b, v0, a0[r]);
      a1[r] = _mm256_fmadd_ps(b, v1, a1[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(o + r * dv + c0, a0[r]);
    _mm256_storeu_ps(o + r * dv + c0 + 8, a1[r]);
  }
}

template <KvType T, int R>
void rows_block(const AttendArgs& a, int r0, int64_t j0, int64_t lo, int64_t hi, float* s) {
  const uint8_t* blk = a.k + size_t(j0 / kAttendBlock) * a.k_block_stride;
  const uint8_t* v = a.v + size_t(j0) * a.v_row_stride;
  const bool lead = r0 == 0;  // the pass that prefetches
  PacedPrefetch pf = lead ? value_rows_prefetch(a, j0, lo, hi) : PacedPrefetch();
  for (int64_t c = 0; c < kAttendBlock; c += 16) scores_tile<T, R>(a.q + r0 * a.dk, a.dk, blk, c, s + r0 * kAttendBlock, pf);
  pf.rest();
  // the block's softmax step for each row, without branches: keys outside [lo, hi) weigh 0; the
  // rows' corrections exp(m - m') in one vector (m = -inf gives 0), applied to o as the value
  // tiles load it
  alignas(32) float m_old[8] = {}, m_new[8] = {}, corr[8];
  for (int r = 0; r < R; ++r) {
    m_old[r] = a.m[r0 + r];
    m_new[r] = std::max(m_old[r], live_max(s + (r0 + r) * kAttendBlock, lo, hi));
  }
  _mm256_store_ps(corr, exp8(_mm256_sub_ps(_mm256_load_ps(m_old), _mm256_load_ps(m_new))));
  for (int r = 0; r < R; ++r) {
    float* sr = s + (r0 + r) * kAttendBlock;
    const __m256 mm = _mm256_set1_ps(m_new[r]);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t j = 0; j < kAttendBlock; j += 8) {
      const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sr + j), mm));
      _mm256_storeu_ps(sr + j, e);
      sum = _mm256_add_ps(sum, e);
    }
    a.l[r0 + r] = a.l[r0 + r] * corr[r] + hsum(sum);
    a.m[r0 + r] = m_new[r];
  }
  pf = lead ? next_key_block_prefetch(a, j0) : PacedPrefetch();
  for (int64_t c0 = 0; c0 < a.dv; c0 += 16)
    values_tile<T, R>(s + r0 * kAttendBlock, corr, lo, hi, v, a.v_row_stride, c0, a.o + r0 * a.dv, a.dv, pf);
  pf.rest();
}

// rows_block_q8 for the min(R, rows - r0) rows from r0
template <int R, int NK>
void rows_pass_q8(const AttendArgs& a, const QueryQ8& qq, const QueryQ8T& qt, int r0, int64_t j0, int64_t lo,
                  int64_t hi) {
  if constexpr (R > 1) {
    if (a.rows - r0 < R) return rows_pass_q8<R - 1, NK>(a, qq, qt, r0, j0, lo, hi);
  }
  rows_block_q8<R, NK>(a, qq, qt, r0, j0, lo, hi);
}

template <KvType T>
void attend_simd(const AttendArgs& a) {
  alignas(32) float s[kAttendMaxRows * kAttendBlock];
  std::optional<QueryQ8> qq;
  if constexpr (T == KvType::q8_0) qq.emplace(a.q, a.rows, a.dk);
  const QueryQ8* q = qq ? &*qq : nullptr;
  std::optional<QueryQ8T> qts[kAttendMaxRows / 8];
  if constexpr (T == KvType::q8_0)
    for (int r0 = 0; r0 < a.rows; r0 += 8) qts[r0 / 8].emplace(q->view, r0, std::min(8, a.rows - r0));
  for (int64_t j0 = 0; j0 < a.n; j0 += kAttendBlock) {
    const int64_t lo = std::max<int64_t>(a.first - j0, 0), hi = std::min<int64_t>(a.n - j0, kAttendBlock);
    if (lo >= hi) continue;
    if constexpr (T == KvType::q8_0) {
      const int64_t hi2 = std::min<int64_t>(a.n - j0, 2 * kAttendBlock);  // two blocks a step where both hold keys
      if (hi2 > kAttendBlock) {
        for (int r0 = 0; r0 < a.rows; r0 += 8) rows_pass_q8<8, 2>(a, *q, *qts[r0 / 8], r0, j0, lo, hi2);
        j0 += kAttendBlock;
      } else {
        for (int r0 = 0; r0 < a.rows; r0 += 8) rows_pass_q8<8, 1>(a, *q, *qts[r0 / 8], r0, j0, lo, hi);
      }
    } else {
      for (int r0 = 0; r0 < a.rows; r0 += 4) {
        switch (std::min(4, a.rows - r0)) {
          case 1: rows_block<T, 1>(a, r0, j0, lo, hi, s); break;
          case 2: rows_block<T, 2>(a, r0, j0, lo, hi, s); break;
          case 3: rows_block<T, 3>(a, r0, j0, lo, hi, s); break;
          default: rows_block<T, 4>(a, r0, j0, lo, hi, s); break;
        }
      }
    }
  }
}

void add_attend_simd(AttendFn* attend) {
  attend[size_t(KvType::f32)] = attend_simd<KvType::f32>;
  attend[size_t(KvType::f16)] = attend_simd<KvType::f16>;
  attend[size_t(KvType::q8_0)] = attend_simd<KvType::q8_0>;
}

}  // namespace
}  // namespace strata::cpu
