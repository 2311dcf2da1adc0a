// Decode attention kernels (kernels.h AttendFn) in 512-bit vectors, for each KV entry format.
//
// Per step of two key blocks of 32 keys wherever two are left (q8_0: four wherever four are left,
// else two; rows_block_q8), for up to 8 query rows at once (a GQA group of 8 in one pass, so the
// step's keys and values are loaded and widened once for all of them; the 256-bit f32 / f16
// kernels of ../avx2/attend_impl.h take 4 rows a pass and widen every entry twice for such a group):
//   scores: per key block the 32 keys as two 16-wide vectors, 2 accumulators a row (16 of the 32
//           registers), each widened key vector feeding every row (f16: vcvtph2ps); q8_0 keys in
//           integers: the query quantized to q8_0 once a call, then per 16 keys and group of 32
//           dims 8 vpdpbusd a row (4 dims a lane), the exact sums times the two scales;
//   the step's online-softmax step per row;
//   values: output tiles of 8 rows by 32 value columns accumulated over the step's keys, value
//           rows widened as they are read; q8_0 values in integers: the step's softmax weights
//           times the rows' scales rounded to int16, two keys a vpdpwssd lane against the int8
//           quants (values_q8).
// Nothing is widened into memory; the step's scores ([rows][keys]) stay in L1. The first pass over
// a step paces the prefetches (simd_common.h PacedPrefetchTo): its scores loop one line of the
// step's value rows per dimension, its value loop one line of the next step's key blocks per key;
// f32 / f16 into L1, q8_0 into L2 (rows_block_q8).

// GCC 12's avx512fintrin.h initialises its "undefined" vectors from themselves (GCC PR 105593),
// which -Wuninitialized then reports at every inlined use; fixed in GCC 13.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "cpu/avx2/simd_common.h"
#include "cpu/avx512/exp512.h"
#include "cpu/kernels.h"
#include "cpu/kv_format.h"
#include "cpu/quant_blocks.h"

namespace strata::cpu {
namespace {

constexpr int64_t kBlock = kKvKeyBlock;  // 32 keys: two vectors
constexpr int kRowsPerPass = 8;
static_assert(kBlock == 32, "the kernels hold a key block in two 16-wide vectors");

// 16 consecutive entries at p as floats
template <KvType T>
inline __m512 load16f(const uint8_t* p) {
  static_assert(T == KvType::f32 || T == KvType::f16);
  if constexpr (T == KvType::f32) return _mm512_loadu_ps(p);
  else return _mm512_cvtph_ps(load32(p));
}
template <KvType T>
constexpr size_t entry_bytes() {
  return T == KvType::f32 ? 4 : 2;
}

// s[r][0 .. 16 H) (stride lds) = q_r . K_j for rows r0 .. r0 + R of q and the first 16 H keys of a
// q8_0 key block: per half of the block (16 keys, 16 int32 lanes), each group of 32 dims as 8
// vpdpbusd of the keys' offset bytes (4 dims a lane) against the row's 4 int8 values broadcast,
// the exact sum then times the key's and the row's scales. Keys past n are not stored.
// pf.step() dk / 4 times a half.
template <int R, class Prefetch>
void scores_block_q8(const QueryQ8View& qq, int r0, const uint8_t* blk, int64_t n, float* s, int64_t lds,
                     Prefetch& pf) {
  const int64_t dk = qq.dk, ng = dk / 32;
  const uint8_t* scales = blk + dk * kBlock;  // halves [dk / 32][32]
  for (int h = 0; h < 2 && 16 * h < n; ++h) {
    __m512 tot[R];
    for (int r = 0; r < R; ++r) tot[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; ++g) {
      __m512i acc[R];
      for (int r = 0; r < R; ++r) acc[r] = _mm512_set1_epi32(qq.off[(r0 + r) * ng + g]);
#pragma GCC unroll 8
      for (int64_t u = 0; u < 8; ++u) {
        const __m512i k = _mm512_loadu_si512(blk + ((g * 8 + u) * kBlock + 16 * h) * 4);
        pf.step();
        for (int r = 0; r < R; ++r) {
          int32_t q4;
          __builtin_memcpy(&q4, qq.q + (r0 + r) * dk + g * 32 + u * 4, 4);
          acc[r] = _mm512_dpbusd_epi32(acc[r], k, _mm512_set1_epi32(q4));
        }
      }
      const __m512 ks = _mm512_cvtph_ps(load32(scales + size_t(g * kBlock + 16 * h) * 2));
      for (int r = 0; r < R; ++r)
        tot[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r]), _mm512_mul_ps(ks, _mm512_set1_ps(qq.d[(r0 + r) * ng + g])),
                                 tot[r]);
    }
    const int64_t left = n - 16 * h;
    const __mmask16 keep = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
    for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(s + r * lds + 16 * h, keep, tot[r]);
  }
}

// The lanes of keys 16 i .. 16 i + 15 of a step that lie in [lo, hi) (the keys the step weighs).
inline __mmask16 live_keys16(int64_t lo, int64_t hi, int i) {
  const int64_t a0 = std::clamp<int64_t>(lo - 16 * i, 0, 16), a1 = std::clamp<int64_t>(hi - 16 * i, 0, 16);
  return __mmask16(((1u << a1) - 1) & ~((1u << a0) - 1));
}

// s[r][0 .. 32) (rows lds apart) = q_r . K_j for the R rows of q ([R][dk]) and the block's 32 keys
// (f32, f16).
template <KvType T, int R>
void scores_block(const float* q, int64_t dk, const uint8_t* blk, float* s, int64_t lds, PacedPrefetch& pf) {
  __m512 a0[R], a1[R];
  for (int r = 0; r < R; ++r) a0[r] = a1[r] = _mm512_setzero_ps();
  auto step = [&](int64_t d, __m512 k0, __m512 k1) {
    for (int r = 0; r < R; ++r) {
      const __m512 b = _mm512_set1_ps(q[r * dk + d]);
      a0[r] = _mm512_fmadd_ps(b, k0, a0[r]);
      a1[r] = _mm512_fmadd_ps(b, k1, a1[r]);
    }
  };
  constexpr size_t es = entry_bytes<T>();
  for (int64_t d = 0; d < dk; ++d) {
    const uint8_t* row = blk + size_t(d * kBlock) * es;
    pf.step();
    step(d, load16f<T>(row), load16f<T>(row + 16 * es));
  }
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(s + r * lds, a0[r]);
    _mm512_storeu_ps(s + r * lds + 16, a1[r]);
  }
}

// o[r][c0 .. c0 + 16 C) = o[r][..] corr[r] + sum over keys j in [lo, hi) of p[r][j] V_j (C = 1 or
// 2 vectors of columns; p's rows NB floats apart): R rows, value rows of the step's keys at v
// (row_stride bytes apart). Out of line: inlined into rows_block, GCC 12 spilled the widened value
// vectors to the stack.
template <KvType T, int R, int C, int NB>
__attribute__((noinline)) void values_tile(const float* p, const float* corr, int64_t lo, int64_t hi,
                                           const uint8_t* v, size_t row_stride, int64_t c0, float* o, int64_t dv,
                                           PacedPrefetch& pf) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c)
      acc[r][c] = _mm512_mul_ps(_mm512_loadu_ps(o + r * dv + c0 + 16 * c), _mm512_set1_ps(corr[r]));
  for (int64_t j = lo; j < hi; ++j) {
    const uint8_t* row = v + size_t(j) * row_stride;
    pf.step();
    __m512 vv[C];
    constexpr size_t es = entry_bytes<T>();
    for (int c = 0; c < C; ++c) vv[c] = load16f<T>(row + size_t(c0 + 16 * c) * es);
    for (int r = 0; r < R; ++r) {
      const __m512 b = _mm512_set1_ps(p[r * NB + j]);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(b, vv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(o + r * dv + c0 + 16 * c, acc[r][c]);
}

// Lane r of the result (r < R <= 8) = op over the 32 scores x[r][0], x[r][1] of row r, other lanes
// anything: the rows transposed as they are reduced (three rounds of 128-bit and in-lane
// shuffles for all rows together), where reducing each row alone took eight dependent steps a row.
template <int R, class Op>
inline __m512 rows_reduce(const __m512 (&x)[R][2], __m512 pad, Op op) {
  static_assert(R >= 1 && R <= 8);
  __m512 a[8];
  for (int r = 0; r < 8; ++r) a[r] = r < R ? op(x[r][0], x[r][1]) : pad;
  __m512 b[4];  // b[i]: row 2i's 8 partials in quarters 0-1, row 2i + 1's in 2-3
  for (int i = 0; i < 4; ++i)
    b[i] = op(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
              _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  __m512 c[2];  // c[i]: row 4i + k's 4 partials in quarter k
  for (int i = 0; i < 2; ++i)
    c[i] = op(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
              _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  // quarter k: lanes (row k, row k + 4) twice
  const __m512 u = op(_mm512_unpacklo_ps(c[0], c[1]), _mm512_unpackhi_ps(c[0], c[1]));
  const __m512 t = op(u, _mm512_shuffle_ps(u, u, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0), t);
}
inline __m512 max_op(__m512 x, __m512 y) { return _mm512_max_ps(x, y); }
inline __m512 add_op(__m512 x, __m512 y) { return _mm512_add_ps(x, y); }

// ---- q8_0 values in integers ----
//
// A step's softmax weights times the value rows' scales, w_j = p_j d_j (p_j = exp(s_j - the
// step's max score) <= 1), are rounded to int16 against the step's largest scale: 32767 w_j /
// dmax. Then vpdpwssd takes two keys a lane: (w_j, w_j+1) broadcast against the int8 quants of
// rows j and j + 1 widened to int16 and interleaved by column; the exact int32 sums go to floats
// once per step, times dmax / 32767 and the step's exp(max - m). Per key and 16 columns that is
// one vpdpwssd a row for half a key, where widening to floats cost a conversion chain and one FMA
// a row per key. The rounding of w_j is at most 2^-16 of the step's largest weight, where the
// values' own q8_0 step is 2^-7 of their block's largest.

// The dword of a row's weights that holds the int16 weights of keys 2i and 2i + 1 of a step: per
// 32 keys one _mm512_packs_epi32(keys 0-15, keys 16-31), which interleaves its two sources by
// 128-bit lane.
// Periodic in 32 pairs (64 keys): pair p's dword is (p & ~31) + kPairDword[p & 31].
constexpr int8_t kPairDword[32] = {0,  1,  4,  5,  8,  9,  12, 13, 2,  3,  6,  7,  10, 11, 14, 15,
                                   16, 17, 20, 21, 24, 25, 28, 29, 18, 19, 22, 23, 26, 27, 30, 31};

// o[r][32 b .. 32 b + 32) = o[r][..] corr[r] + scale[r] sum over keys j in [j_lo, hi) of w[r][j] v_j
// (value block b): w [R][WS] dwords of int16 weight pairs as kPairDword places them (0 outside
// the keys of the step's range), value rows at v (row_stride bytes apart), j_lo even. The
// interleave leaves column 8k + i of the 32 in lane 4k + i of the low sums (i < 4) and 4k + i - 4
// of the high; the floats are put back in column order before they meet o.
template <int R, int WS, class Prefetch>
__attribute__((noinline)) void values_q8(const int32_t* w, const float* corr, const float* scale, int64_t j_lo,
                                         int64_t hi, const uint8_t* v, size_t row_stride, int64_t b, float* o,
                                         int64_t dv, Prefetch& pf) {
  __m512i acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
  const uint8_t* row = v + size_t(j_lo) * row_stride + size_t(b) * sizeof(block_q8_0) + offsetof(block_q8_0, qs);
  // one loop with no branch or tail: an odd last key pairs with the row after it (weight 0;
  // AttendArgs::v). A tail after the loop, or a masked load, made GCC 12 copy every accumulator
  // once or twice an iteration.
  for (int64_t j = j_lo; j < hi; j += 2, row += 2 * row_stride) {
    pf.step();
    const __m512i v0 = _mm512_cvtepi8_epi16(load32(row));
    const __m512i v1 = _mm512_cvtepi8_epi16(load32(row + row_stride));
    const __m512i lo = _mm512_unpacklo_epi16(v0, v1), hi_cols = _mm512_unpackhi_epi16(v0, v1);
    const int32_t* wj = w + ((j / 2) & ~int64_t(31)) + kPairDword[(j / 2) & 31];
    for (int r = 0; r < R; ++r) {
      const __m512i pw = _mm512_set1_epi32(wj[WS * r]);
      acc[r][0] = _mm512_dpwssd_epi32(acc[r][0], lo, pw);
      acc[r][1] = _mm512_dpwssd_epi32(acc[r][1], hi_cols, pw);
    }
  }
  // column c's lane: (c % 8 < 4 ? low : high) 4 (c / 8) + c % 4; high lanes are 16 on in permutex2var
  const __m512i cols0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i cols1 = _mm512_add_epi32(cols0, _mm512_set1_epi32(8));
  for (int r = 0; r < R; ++r) {
    const __m512 f0 = _mm512_cvtepi32_ps(acc[r][0]), f1 = _mm512_cvtepi32_ps(acc[r][1]);
    float* orow = o + r * dv + 32 * b;
    const __m512 sc = _mm512_set1_ps(scale[r]), cr = _mm512_set1_ps(corr[r]);
    _mm512_storeu_ps(orow, _mm512_fmadd_ps(_mm512_permutex2var_ps(f0, cols0, f1), sc,
                                           _mm512_mul_ps(_mm512_loadu_ps(orow), cr)));
    _mm512_storeu_ps(orow + 16, _mm512_fmadd_ps(_mm512_permutex2var_ps(f0, cols1, f1), sc,
                                                _mm512_mul_ps(_mm512_loadu_ps(orow + 16), cr)));
  }
}

// rows_block for q8_0 entries, one step over NK consecutive key blocks (keys [lo, hi) of the NK *
// 32 from j0; NK = 4 wherever four blocks are left, else 2 wherever two are, else 1): integer
// scores, the softmax step against the step's own max, then each value block in integers
// (values_q8) over all the step's keys. Longer steps share what each step costs besides its keys
// (the reductions across rows, the value scales' gathers and maxima, the value loops' start and
// their o rows): one block to two took Zen 4 from 26.1-27.8 to 23.5-24.1 ns a key, two to four
// 24.3-25.9 to 23.8-24.6 (BM_attend/avx512/q8_0, one thread, 512 keys in L2, sessions 42 and 44).
// The int32 sums stay far from overflow (128 keys x 32767 x 128 < 2^29).
template <int R, int NK>
void rows_block_q8(const AttendArgs& a, const QueryQ8& qq, int r0, int64_t j0, int64_t lo, int64_t hi) {
  static_assert(NK == 1 || NK == 2 || NK == 4);
  constexpr int64_t NB = NK * kBlock;  // keys a step
  constexpr int NV = int(NB / 16);     // score vectors a row
  const uint8_t* blk = a.k + size_t(j0 / kBlock) * a.k_block_stride;
  const uint8_t* v = a.v + size_t(j0) * a.v_row_stride;
  const bool lead = r0 == 0;  // the pass that prefetches
  // into L2, not L1: a four-block step's value rows (17 KB for 128 dims) and the next step's key
  // blocks (17 KB) together overflow a 32 KB L1, so lines fetched into it for the next step pushed
  // out this step's value rows, read four times. Into L2, the cache read from DRAM as the forward
  // pass does (BM_attention_decode/q8_0, 2 threads, Zen 4, medians of 5-8 alternated runs):
  // depth 16384 1196-1455 -> 949-1191 us a layer, depth 4096 301 -> 262 (level in a slow phase);
  // one thread over 131072 keys (BM_attend/avx512/q8_0/dram, both cores running one) 33.6-43.5
  // -> 31-39 ns a key; in L2 level. The f16 kernel (16 + 16 KB a
  // two-block step, each value line read once) went slower so: 55-67 -> 68-82 ns a key from DRAM.
  using Prefetch = PacedPrefetchTo<_MM_HINT_T1>;
  Prefetch pf = lead ? value_rows_prefetch<_MM_HINT_T1>(a, j0, lo, hi) : Prefetch();
  alignas(64) float sb[kRowsPerPass * NB];  // the step's scores, then its weights exp(s - max), [R][NB]
  for (int kb = 0; kb < NK; ++kb)
    scores_block_q8<R>(qq.view, r0, blk + kb * a.k_block_stride, kBlock, sb + kb * kBlock, NB, pf);
  pf.rest();
  // per row: the step's max score bm over [lo, hi), m' = max(m, bm), the correction exp(m - m')
  // of what o holds, the step's factor exp(bm - m'), and its weights exp(s - bm) (0 outside)
  const auto live16 = [&](int i) { return live_keys16(lo, hi, i); };
  const __mmask16 rows = __mmask16((1u << R) - 1);
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  const auto score = [&](int r, int i) {
    return _mm512_mask_blend_ps(live16(i), ninf, _mm512_load_ps(sb + r * NB + 16 * i));
  };
  __m512 x[R][2];  // per row two vectors of partial maxima, then of partial sums
  for (int r = 0; r < R; ++r) {
    x[r][0] = score(r, 0);
    x[r][1] = score(r, 1);
    for (int i = 2; i < NV; ++i) x[r][i % 2] = _mm512_max_ps(x[r][i % 2], score(r, i));
  }
  alignas(64) float bm[16], corr[16], e[16];
  const __m512 bmv = rows_reduce<R>(x, ninf, max_op);
  const __m512 m_old = _mm512_maskz_loadu_ps(rows, a.m + r0), m_new = _mm512_max_ps(m_old, bmv);
  const __m512 corrv = exp16(_mm512_sub_ps(m_old, m_new)), ev = exp16(_mm512_sub_ps(bmv, m_new));
  _mm512_store_ps(bm, bmv);
  _mm512_store_ps(corr, corrv);
  _mm512_store_ps(e, ev);
  _mm512_mask_storeu_ps(a.m + r0, rows, m_new);
  for (int r = 0; r < R; ++r) {
    const __m512 mm = _mm512_set1_ps(bm[r]);
    x[r][0] = x[r][1] = _mm512_setzero_ps();
    for (int i = 0; i < NV; ++i) {
      const __m512 p = exp16(_mm512_sub_ps(score(r, i), mm));
      _mm512_store_ps(sb + r * NB + 16 * i, p);
      x[r][i % 2] = _mm512_add_ps(x[r][i % 2], p);
    }
  }
  const __m512 sums = rows_reduce<R>(x, _mm512_setzero_ps(), add_op);
  _mm512_mask_storeu_ps(a.l + r0, rows,
                        _mm512_fmadd_ps(_mm512_maskz_loadu_ps(rows, a.l + r0), corrv, _mm512_mul_ps(ev, sums)));
  const int64_t nb = a.dv / 32, j_lo = lo & ~int64_t(1);
  pf = lead ? next_key_block_prefetch<_MM_HINT_T1>(a, j0, NK) : Prefetch();
  constexpr int WS = int(NB / 2);  // weight pairs a row
  alignas(64) int32_t w[R * WS];
  // byte offsets of the step's value rows, 16 keys a vector: their scales are gathered (live keys only)
  __m512i rows_at[NV];
  rows_at[0] = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                  _mm512_set1_epi32(int(a.v_row_stride)));
  const __m512i rows16 = _mm512_set1_epi32(int(16 * a.v_row_stride));
  for (int i = 1; i < NV; ++i) rows_at[i] = _mm512_add_epi32(rows_at[i - 1], rows16);
  float scale[R];
  for (int64_t b = 0; b < nb; ++b) {
    // the value rows' scales of block b (0 outside [lo, hi): the unwritten slots may hold anything)
    const uint8_t* d = v + size_t(b) * sizeof(block_q8_0);
    __m512 dn[NV];
    __m512 dm = _mm512_setzero_ps();
    for (int i = 0; i < NV; ++i) {
      dn[i] = _mm512_cvtph_ps(
          _mm512_cvtepi32_epi16(_mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live16(i), rows_at[i], d, 1)));
      dm = _mm512_max_ps(dm, dn[i]);
    }
    const float dmax = _mm512_reduce_max_ps(dm);
    const __m512 k = _mm512_set1_ps(dmax > 0 ? 32767.0f / dmax : 0.0f);
    for (int i = 0; i < NV; ++i) dn[i] = _mm512_mul_ps(dn[i], k);
    for (int r = 0; r < R; ++r) {
      const auto weights16 = [&](int i) {  // keys 16 i .. 16 i + 15 of row r as int32
        return _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(sb + r * NB + 16 * i), dn[i]));
      };
      for (int i = 0; i < NV; i += 2)
        _mm512_store_si512(w + r * WS + 8 * i, _mm512_packs_epi32(weights16(i), weights16(i + 1)));
      scale[r] = e[r] * (dmax / 32767.0f);
    }
    values_q8<R, WS>(w, corr, scale, j_lo, hi, v, a.v_row_stride, b, a.o + r0 * a.dv, a.dv, pf);
  }
  pf.rest();
}

// rows_block for f32 / f16 entries over NK consecutive key blocks (keys [lo, hi) of the NK * 32
// from j0; NK = 2 wherever two blocks are left): the scores of the step's keys, one softmax step
// for them, then each value tile over all of them, so the o rows are loaded and stored, and each
// row's maximum and sum reduced, once per step. s: [rows][NK * 32] floats. Two blocks a step
// against one, f16 on Zen 4 (BM_attend/avx512/f16, one thread, CPU time a call of 512 keys, 5
// alternated runs while the other core built): 25.6-25.8 -> 23.3-25.8 us (mostly 23.3-23.9); over
// 131072 keys from DRAM 7089-7758 -> 6813-7016 us (session 44).
template <KvType T, int R, int NK>
void rows_block(const AttendArgs& a, int r0, int64_t j0, int64_t lo, int64_t hi, float* s) {
  static_assert(NK == 1 || NK == 2);
  constexpr int NB = NK * int(kBlock), NV = NB / 16;
  const uint8_t* blk = a.k + size_t(j0 / kBlock) * a.k_block_stride;
  const uint8_t* v = a.v + size_t(j0) * a.v_row_stride;
  const bool lead = r0 == 0;  // the pass that prefetches
  PacedPrefetch pf = lead ? value_rows_prefetch(a, j0, lo, hi) : PacedPrefetch();
  for (int kb = 0; kb < NK; ++kb)
    scores_block<T, R>(a.q + r0 * a.dk, a.dk, blk + kb * a.k_block_stride, s + r0 * NB + kb * kBlock, NB, pf);
  pf.rest();
  // the step's softmax for each row, without branches: keys outside [lo, hi) weigh 0; the
  // rows' corrections exp(m - m') in one vector (m = -inf gives 0), applied to o as the value
  // tiles load it. Each row reduced alone: holding all 16 score vectors for rows_reduce, as
  // rows_block_q8 does, made this kernel slower (f16 21.4 against 19.4 ns a key, BM_attend)
  const auto live16 = [&](int i) { return live_keys16(lo, hi, i); };
  alignas(64) float m_old[16] = {}, m_new[16] = {}, corr[16];
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  for (int r = 0; r < R; ++r) {
    float* sr = s + (r0 + r) * NB;
    __m512 mx = ninf;
    for (int i = 0; i < NV; ++i) {
      const __m512 x = _mm512_mask_blend_ps(live16(i), ninf, _mm512_loadu_ps(sr + 16 * i));
      _mm512_storeu_ps(sr + 16 * i, x);
      mx = _mm512_max_ps(mx, x);
    }
    m_old[r] = a.m[r0 + r];
    m_new[r] = std::max(m_old[r], _mm512_reduce_max_ps(mx));
  }
  _mm512_store_ps(corr, exp16(_mm512_sub_ps(_mm512_load_ps(m_old), _mm512_load_ps(m_new))));
  for (int r = 0; r < R; ++r) {
    float* sr = s + (r0 + r) * NB;
    const __m512 mm = _mm512_set1_ps(m_new[r]);
    __m512 sum = _mm512_setzero_ps();
    for (int i = 0; i < NV; ++i) {
      const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(sr + 16 * i), mm));
      _mm512_storeu_ps(sr + 16 * i, e);
      sum = _mm512_add_ps(sum, e);
    }
    a.l[r0 + r] = a.l[r0 + r] * corr[r] + _mm512_reduce_add_ps(sum);
    a.m[r0 + r] = m_new[r];
  }
  pf = lead ? next_key_block_prefetch(a, j0, NK) : PacedPrefetch();
  int64_t c0 = 0;
  for (; c0 + 32 <= a.dv; c0 += 32)
    values_tile<T, R, 2, NB>(s + r0 * NB, corr, lo, hi, v, a.v_row_stride, c0, a.o + r0 * a.dv, a.dv, pf);
  if (c0 < a.dv)
    values_tile<T, R, 1, NB>(s + r0 * NB, corr, lo, hi, v, a.v_row_stride, c0, a.o + r0 * a.dv, a.dv, pf);
  pf.rest();
}

template <KvType T, int R, int NK>
void rows_pass(const AttendArgs& a, int r0, int64_t j0, int64_t lo, int64_t hi, float* s) {
  if constexpr (R > 1) {
    if (a.rows - r0 < R) return rows_pass<T, R - 1, NK>(a, r0, j0, lo, hi, s);
  }
  rows_block<T, R, NK>(a, r0, j0, lo, hi, s);
}

// rows_block_q8 for the min(R, rows - r0) rows from r0
template <int R, int NK>
void rows_pass_q8(const AttendArgs& a, const QueryQ8& qq, int r0, int64_t j0, int64_t lo, int64_t hi) {
  if constexpr (R > 1) {
    if (a.rows - r0 < R) return rows_pass_q8<R - 1, NK>(a, qq, r0, j0, lo, hi);
  }
  rows_block_q8<R, NK>(a, qq, r0, j0, lo, hi);
}

template <KvType T>
void attend_avx512(const AttendArgs& a) {
  alignas(64) float s[kAttendMaxRows * 2 * kBlock];
  std::optional<QueryQ8> qq;
  if constexpr (T == KvType::q8_0) qq.emplace(a.q, a.rows, a.dk);
  for (int64_t j0 = 0; j0 < a.n; j0 += kBlock) {
    const int64_t lo = std::max<int64_t>(a.first - j0, 0), hi = std::min<int64_t>(a.n - j0, kBlock);
    if (lo >= hi) continue;
    if constexpr (T == KvType::q8_0) {
      // four blocks a step where all four hold keys, else two where both do
      const int64_t hi2 = std::min<int64_t>(a.n - j0, 2 * kBlock);
      if (a.n - j0 > 3 * kBlock) {
        const int64_t hi4 = std::min<int64_t>(a.n - j0, 4 * kBlock);
        for (int r0 = 0; r0 < a.rows; r0 += kRowsPerPass) rows_pass_q8<kRowsPerPass, 4>(a, *qq, r0, j0, lo, hi4);
        j0 += 3 * kBlock;
      } else if (hi2 > kBlock) {
        for (int r0 = 0; r0 < a.rows; r0 += kRowsPerPass) rows_pass_q8<kRowsPerPass, 2>(a, *qq, r0, j0, lo, hi2);
        j0 += kBlock;
      } else {
        for (int r0 = 0; r0 < a.rows; r0 += kRowsPerPass) rows_pass_q8<kRowsPerPass, 1>(a, *qq, r0, j0, lo, hi);
      }
    } else if (a.n - j0 > kBlock) {  // two blocks a step where both hold keys
      const int64_t hi2 = std::min<int64_t>(a.n - j0, 2 * kBlock);
      for (int r0 = 0; r0 < a.rows; r0 += kRowsPerPass) rows_pass<T, kRowsPerPass, 2>(a, r0, j0, lo, hi2, s);
      j0 += kBlock;
    } else {
      for (int r0 = 0; r0 < a.rows; r0 += kRowsPerPass) rows_pass<T, kRowsPerPass, 1>(a, r0, j0, lo, hi, s);
    }
  }
}

// kernels.h ScoresQ8Fn: 8 rows a pass
void scores_q8(const QueryQ8View& q, int rows, const uint8_t* key_block, int64_t n, float* s, int64_t lds) {
  PacedPrefetch none;
  int r0 = 0;
  for (; r0 + 8 <= rows; r0 += 8) scores_block_q8<8>(q, r0, key_block, n, s + r0 * lds, lds, none);
  switch (rows - r0) {
    case 7: scores_block_q8<7>(q, r0, key_block, n, s + r0 * lds, lds, none); break;
    case 6: scores_block_q8<6>(q, r0, key_block, n, s + r0 * lds, lds, none); break;
    case 5: scores_block_q8<5>(q, r0, key_block, n, s + r0 * lds, lds, none); break;
    case 4: scores_block_q8<4>(q, r0, key_block, n, s + r0 * lds, lds, none); break;
    case 3: scores_block_q8<3>(q, r0, key_block, n, s + r0 * lds, lds, none); break;
    case 2: scores_block_q8<2>(q, r0, key_block, n, s + r0 * lds, lds, none); break;
    case 1: scores_block_q8<1>(q, r0, key_block, n, s + r0 * lds, lds, none); break;
    default: break;
  }
}

}  // namespace

namespace detail {
ScoresQ8Fn scores_q8_avx512() { return scores_q8; }
void add_attend_avx512(AttendFn* attend) {
  attend[size_t(KvType::f32)] = attend_avx512<KvType::f32>;
  attend[size_t(KvType::f16)] = attend_avx512<KvType::f16>;
  attend[size_t(KvType::q8_0)] = attend_avx512<KvType::q8_0>;
}
}  // namespace detail
}  // namespace strata::cpu
