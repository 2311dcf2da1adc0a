// Decode attention kernels (kernels.h AttendFn) in 256-bit vectors, for each KV entry format,
// compiled by attend_avx2.cpp with the AVX2 flags (../avx512/attend_avx512.cpp has its own
// 512-bit kernels: 8 rows a pass in 32 registers). In an unnamed namespace, as simd_common.h.
//
// Per key block of 32 keys: the scores of up to 4 query rows by 16 keys at a time (8 accumulators:
// each widened key vector feeds 4 rows), read straight from the cache entries (f16: F16C; q8_0:
// in integers, `vpmaddubsw` / `vpmaddwd` on each key's 4 dims against the query quantized to q8_0
// once a call, scores_tile_q8); the block's softmax step; then the output
// tiles of 4 rows by 16 value columns accumulated over the block's keys, value rows widened as
// they are read. Nothing is widened into memory, and the block's scores ([rows][32]) stay in L1.
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

// 8 consecutive entries at p as floats (q8_0: the int8 values, unscaled)
template <KvType T>
inline __m256 load8(const uint8_t* p) {
  if constexpr (T == KvType::f32) return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  else if constexpr (T == KvType::f16) return _mm256_cvtph_ps(load16(p));
  else return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
template <KvType T>
constexpr size_t entry_bytes() {
  return T == KvType::f32 ? 4 : T == KvType::f16 ? 2 : 1;
}

// q8_0 keys: s[r][c .. c + 16) = q_r . K_j for rows r0 .. r0 + R of the query in q8_0 (its offsets
// unused: the keys are made signed instead) and keys
// c .. c + 15 of the block, 8 keys at a time: per key dword (4 dims) `vpmaddubsw` of |k| against
// the row's 4 quants signed as k (|k| <= 128 and |q| <= 127: no int16 saturation), `vpmaddwd` to
// the key's int32 sum; per group of 32 dims the exact sum times the key's and the row's scales.
// pf.step() dk / 2 times.
template <int R>
void scores_tile_q8(const QueryQ8View& qq, int r0, const uint8_t* blk, int64_t c, float* s, PacedPrefetch& pf) {
  const int64_t dk = qq.dk, ng = dk / 32;
  const uint8_t* scales = blk + dk * kAttendBlock;  // halves [dk / 32][32]
  const __m256i flip = _mm256_set1_epi8(char(0x80)), ones = _mm256_set1_epi16(1);  // offset bytes -> int8
  for (int64_t c8 = c; c8 < c + 16; c8 += 8) {
    __m256 tot[R];
    for (int r = 0; r < R; ++r) tot[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; ++g) {
      __m256i acc[R];
      for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int64_t u = g * 8; u < g * 8 + 8; ++u) {
        const __m256i k = _mm256_xor_si256(load32(blk + size_t(u * kAttendBlock + c8) * 4), flip);
        const __m256i ka = _mm256_abs_epi8(k);
        pf.step();
        for (int r = 0; r < R; ++r) {
          int32_t q4;
          std::memcpy(&q4, qq.q + (r0 + r) * dk + u * 4, 4);
          const __m256i qs = _mm256_sign_epi8(_mm256_set1_epi32(q4), k);
          acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(_mm256_maddubs_epi16(ka, qs), ones));
        }
      }
      const __m256 ks = _mm256_cvtph_ps(load16(scales + size_t(g * kAttendBlock + c8) * 2));
      for (int r = 0; r < R; ++r)
        tot[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r]), _mm256_mul_ps(ks, _mm256_set1_ps(qq.d[(r0 + r) * ng + g])),
                                 tot[r]);
    }
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(s + r * kAttendBlock + c8, tot[r]);
  }
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
  static_assert(T != KvType::q8_0, "q8_0 keys: scores_tile_q8");
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
    __m256 v0, v1;
    if constexpr (T == KvType::q8_0) {
      const auto* b = reinterpret_cast<const block_q8_0*>(row) + c0 / 32;
      const __m256 d = _mm256_set1_ps(half_to_float(b->d));
      const uint8_t* qs = reinterpret_cast<const uint8_t*>(b->qs) + c0 % 32;
      v0 = _mm256_mul_ps(load8<T>(qs), d);
      v1 = _mm256_mul_ps(load8<T>(qs + 8), d);
    } else {
      constexpr size_t es = entry_bytes<T>();
      v0 = load8<T>(row + size_t(c0) * es);
      v1 = load8<T>(row + size_t(c0 + 8) * es);
    }
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
void rows_block(const AttendArgs& a, const QueryQ8* qq, int r0, int64_t j0, int64_t lo, int64_t hi, float* s) {
  const uint8_t* blk = a.k + size_t(j0 / kAttendBlock) * a.k_block_stride;
  const uint8_t* v = a.v + size_t(j0) * a.v_row_stride;
  const bool lead = r0 == 0;  // the pass that prefetches
  PacedPrefetch pf = lead ? value_rows_prefetch(a, j0, lo, hi) : PacedPrefetch();
  for (int64_t c = 0; c < kAttendBlock; c += 16) {
    if constexpr (T == KvType::q8_0) scores_tile_q8<R>(qq->view, r0, blk, c, s + r0 * kAttendBlock, pf);
    else scores_tile<T, R>(a.q + r0 * a.dk, a.dk, blk, c, s + r0 * kAttendBlock, pf);
  }
  pf.rest();
  // the block's softmax step for each row, without branches: keys outside [lo, hi) weigh 0; the
  // rows' corrections exp(m - m') in one vector (m = -inf gives 0), applied to o as the value
  // tiles load it
  alignas(32) float m_old[8] = {}, m_new[8] = {}, corr[8];
  for (int r = 0; r < R; ++r) {
    float* sr = s + (r0 + r) * kAttendBlock;
    std::fill(sr, sr + lo, -INFINITY);
    std::fill(sr + hi, sr + kAttendBlock, -INFINITY);
    __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_loadu_ps(sr), _mm256_loadu_ps(sr + 8)),
                              _mm256_max_ps(_mm256_loadu_ps(sr + 16), _mm256_loadu_ps(sr + 24)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    m_old[r] = a.m[r0 + r];
    m_new[r] = std::max(m_old[r], _mm_cvtss_f32(m4));
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

template <KvType T>
void attend_simd(const AttendArgs& a) {
  alignas(32) float s[kAttendMaxRows * kAttendBlock];
  std::optional<QueryQ8> qq;
  if constexpr (T == KvType::q8_0) qq.emplace(a.q, a.rows, a.dk);
  const QueryQ8* q = qq ? &*qq : nullptr;
  for (int64_t j0 = 0; j0 < a.n; j0 += kAttendBlock) {
    const int64_t lo = std::max<int64_t>(a.first - j0, 0), hi = std::min<int64_t>(a.n - j0, kAttendBlock);
    if (lo >= hi) continue;
    for (int r0 = 0; r0 < a.rows; r0 += 4) {
      switch (std::min(4, a.rows - r0)) {
        case 1: rows_block<T, 1>(a, q, r0, j0, lo, hi, s); break;
        case 2: rows_block<T, 2>(a, q, r0, j0, lo, hi, s); break;
        case 3: rows_block<T, 3>(a, q, r0, j0, lo, hi, s); break;
        default: rows_block<T, 4>(a, q, r0, j0, lo, hi, s); break;
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
