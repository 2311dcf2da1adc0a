// AVX2 + FMA + F16C tile kernels (kernels.h GemmFn): Q4_K, Q5_K and Q6_K against Q8_K
// activations, Q8_0, Q4_0, IQ4_NL and MXFP4 against Q8_0 (the 32-element formats), F32, F16 and
// BF16 against floats (further down); the 32-element formats, Q4_K and Q5_K also on
// row-interleaved groups (KernelTable::gemm_interleaved, decode included). Other types (Q5_0)
// fall back to KernelTable::gemm_tile's loop over the AVX2 vec_dot.
//
// Scheme (as in ../avx512/gemm_avx512.cpp, at half the width and without VNNI). The weight rows
// are taken 8 at a time (one int32 lane each). For each super-block the 8 rows' quants are
// unpacked once into scratch as unsigned bytes, interleaved: register g holds, in lane r, the four
// consecutive quants 4g .. 4g + 3 of row r (an 8 x 8 dword transpose, then the nibble / bit
// unpacking). For each token, vpmaddubsw of that register with the broadcast activations
// a[4g .. 4g + 4) gives two int16 pair sums per row; the pair sums of several groups of one
// sub-block are added in int16 (vpaddw, as many as cannot overflow: 8 for Q4_K, 4 for Q5_K, 2 for
// Q6_K) and vpmaddwd with the sub-block scale (as an int16 pair (sc, sc)) sums them into int32,
// weighted. Q4_K: 8 vpmaddubsw and 1 vpmaddwd per sub-block, token and 8 rows, where one
// vpmaddwd per vpmaddubsw made the multiplier ports the limit. Four tokens are held in registers.
// The next super-block's weights are prefetched while the tokens run.
//
// Math. The integer sums are the reference's exactly (vpmaddubsw cannot saturate: a pair is at
// most 2 * 63 * 128 = 16128; the int16 sums' bounds are at q45K_tokens and q6K_tokens); the
// float part differs by rounding order only:
//  - Q4_K / Q5_K: y += da * (d * isum - dmin * imins), the min term sum_s m_s (bsums_2s +
//    bsums_2s+1) by vpmaddwd on the pair sums;
//  - Q6_K: the quants enter as stored (q + 32, unsigned) and -32 * sum_s sc_s bsums_s is added by
//    vpmaddwd on the Q8_K bsums; y += da * (d * isum).
//
// Reentrant: scratch on the stack and in a thread_local buffer. Compiled with -mavx2 -mfma
// -mf16c; called only when the CPU has them. No inline function or template of the shared
// headers is used here (see simd_common.h).
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu/avx2/simd_common.h"
#include "cpu/kernels.h"
#include "cpu/quant_blocks.h"

namespace strata::cpu {
namespace {

constexpr int kRows = 8;  // weight rows per tile: one int32 lane each
constexpr int kTok = 4;   // tokens per register block

inline int32_t load_i32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline __m256i bcast4(const void* p) { return _mm256_set1_epi32(load_i32(p)); }

// Runs fn(std::integral_constant<int, T>, t0) over the tokens in blocks of kTok, then the tail.
template <class Fn>
inline void for_token_blocks(int64_t n_tok, Fn&& fn) {
  int64_t t = 0;
  for (; t + kTok <= n_tok; t += kTok) fn(std::integral_constant<int, kTok>{}, t);
  switch (n_tok - t) {
    case 1: fn(std::integral_constant<int, 1>{}, t); break;
    case 2: fn(std::integral_constant<int, 2>{}, t); break;
    case 3: fn(std::integral_constant<int, 3>{}, t); break;
    default: break;
  }
}

// In place: r[i] holds the dwords (i, 0..7) of an 8 x 8 matrix; afterwards r[j] holds (0..7, j).
inline void transpose_8x8(__m256i r[8]) {
  __m256i t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
  }
  // u[4G + m]: rows 4G .. 4G + 3 of column m (low 128 bits) and m + 4 (high)
  for (int g = 0; g < 8; g += 4) {
    u[g + 0] = _mm256_unpacklo_epi64(t[g], t[g + 2]);
    u[g + 1] = _mm256_unpackhi_epi64(t[g], t[g + 2]);
    u[g + 2] = _mm256_unpacklo_epi64(t[g + 1], t[g + 3]);
    u[g + 3] = _mm256_unpackhi_epi64(t[g + 1], t[g + 3]);
  }
  for (int m = 0; m < 4; ++m) {
    r[m] = _mm256_permute2x128_si256(u[m], u[4 + m], 0x20);
    r[m + 4] = _mm256_permute2x128_si256(u[m], u[4 + m], 0x31);
  }
}

// The 32 bytes at rows[i] + offset of each row, transposed: r[j] lane i = dword j of row i.
inline void load_transposed(const uint8_t* const rows[kRows], size_t offset, __m256i r[8]) {
  for (int i = 0; i < 8; ++i) r[i] = load32(rows[i] + offset);
  transpose_8x8(r);
}

// The 8 rows of a tile: rows past the end repeat the last one (their lanes are not stored).
struct RowTile {
  const uint8_t* rows[kRows];
  __m256i mask;  // all ones in the lanes of real rows
  bool full;     // all 8 rows real
};
inline RowTile row_tile(const void* w, size_t w_stride, int64_t r0, int64_t n_rows) {
  RowTile t;
  const int64_t count = std::min<int64_t>(kRows, n_rows - r0);
  for (int i = 0; i < kRows; ++i)
    t.rows[i] = static_cast<const uint8_t*>(w) + size_t(r0 + std::min<int64_t>(i, count - 1)) * w_stride;
  t.mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(int(count)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  t.full = count == kRows;
  return t;
}

// Asks for the blocks at `offset` (bytes long) of the 8 rows of rt: the next super-block's, one
// super-block ahead of the kernel, whose weights come from DRAM once a prefill layer.
inline void prefetch_blocks(const RowTile& rt, size_t offset, size_t bytes) {
  for (int i = 0; i < kRows; ++i) {
    const char* p = reinterpret_cast<const char*>(rt.rows[i] + offset);
    for (size_t o = 0; o < bytes; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
    _mm_prefetch(p + bytes - 1, _MM_HINT_T0);
  }
}

// y[lanes] = v * scale, or += after the first super-block. Masked only in a tile of fewer than 8
// rows: vmaskmovps stores are slow on AMD cores.
inline void update_rows(float* y, const RowTile& rt, __m256 v, __m256 scale, bool first) {
  if (rt.full) {
    _mm256_storeu_ps(y, first ? _mm256_mul_ps(v, scale) : _mm256_fmadd_ps(v, scale, _mm256_loadu_ps(y)));
    return;
  }
  const __m256 r = first ? _mm256_mul_ps(v, scale) : _mm256_fmadd_ps(v, scale, _mm256_maskload_ps(y, rt.mask));
  _mm256_maskstore_ps(y, rt.mask, r);
}

inline __m256i load_ints(const int32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m256 load_halves(const uint16_t* p) { return _mm256_cvtph_ps(load16(p)); }

constexpr size_t kQ8KQs = offsetof(block_q8_K, qs);
constexpr size_t kQ8KBsums = offsetof(block_q8_K, bsums);

// ---- Q4_K / Q5_K ----
//
// Q5_K is Q4_K with a fifth bit per quant (qh, a bit plane per 32 elements: element 64h + l has
// bit 2h of qh[l], element 64h + 32 + l bit 2h + 1), added to the nibble at unpacking; same scales,
// mins and formula, quants 0 .. 31.

struct TileQ45K {
  __m256i q[64];    // group g: lane r = u8 quants 4g .. 4g + 3 of row r
  __m256i sc[8];    // int16 pairs (sc, sc) per row
  __m256i mins[4];  // int16 pairs per row: (m0, m2), (m1, m3), (m4, m6), (m5, m7)
  __m256 d, dmin;
};

// Bit k of every byte of v moved to bit 4 (the rest 0): a quant's fifth bit.
template <int k>
inline __m256i bit_to_16(__m256i v) {
  const __m256i m16 = _mm256_set1_epi8(0x10);
  if constexpr (k <= 4) return _mm256_and_si256(_mm256_slli_epi32(v, 4 - k), m16);
  else return _mm256_and_si256(_mm256_srli_epi32(v, k - 4), m16);
}

template <class Block>
void unpack_q45K(const RowTile& rt, int64_t sb, TileQ45K& tile) {
  constexpr bool kQ5 = std::is_same_v<Block, block_q5_K>;
  const size_t base = size_t(sb) * sizeof(Block);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256i qh[8];
  if constexpr (kQ5) load_transposed(rt.rows, base + offsetof(Block, qh), qh);
  auto high = [&]<int h>(std::integral_constant<int, h>) {
    __m256i r[8];
    load_transposed(rt.rows, base + offsetof(Block, qs) + 32 * size_t(h), r);
    // qs byte 32h + 4j + i: low nibble element 64h + 4j + i (group 16h + j), high nibble 32 on
    for (int j = 0; j < 8; ++j) {
      __m256i lo = _mm256_and_si256(r[j], m4), hi = _mm256_and_si256(_mm256_srli_epi32(r[j], 4), m4);
      if constexpr (kQ5) {
        lo = _mm256_or_si256(lo, bit_to_16<2 * h>(qh[j]));
        hi = _mm256_or_si256(hi, bit_to_16<2 * h + 1>(qh[j]));
      }
      tile.q[16 * h + j] = lo;
      tile.q[16 * h + 8 + j] = hi;
    }
  };
  high(std::integral_constant<int, 0>{});
  high(std::integral_constant<int, 1>{});
  high(std::integral_constant<int, 2>{});
  high(std::integral_constant<int, 3>{});
  alignas(32) uint8_t sm[kRows][16];  // per row [sc0 .. sc7, m0 .. m7]
  alignas(32) uint16_t d[kRows], dmin[kRows];
  for (int i = 0; i < kRows; ++i) {
    const auto* b = reinterpret_cast<const Block*>(rt.rows[i] + base);
    _mm_store_si128(reinterpret_cast<__m128i*>(sm[i]), unpack_scales_mins_k4(b->scales));
    d[i] = b->d;
    dmin[i] = b->dmin;
  }
  alignas(32) int32_t v[kRows];
  for (int s = 0; s < 8; ++s) {
    for (int i = 0; i < kRows; ++i) v[i] = int32_t(sm[i][s]) * 0x10001;
    tile.sc[s] = load_ints(v);
  }
  const int pair[4][2] = {{0, 2}, {1, 3}, {4, 6}, {5, 7}};
  for (int k = 0; k < 4; ++k) {
    for (int i = 0; i < kRows; ++i) v[i] = int32_t(sm[i][8 + pair[k][0]]) | int32_t(sm[i][8 + pair[k][1]]) << 16;
    tile.mins[k] = load_ints(v);
  }
  tile.d = load_halves(d);
  tile.dmin = load_halves(dmin);
}

// Per token and super-block the Q8_K pair sums p_s = bsums[2s] + bsums[2s + 1] as the int16
// pairs of TileQ45K::mins: (p0, p2), (p1, p3), (p4, p6), (p5, p7). |p_s| <= 32 * 128.
void bsum_pairs(const uint8_t* a, size_t a_stride, int64_t n_tok, int64_t nsb, std::vector<int32_t>& out) {
  out.resize(size_t(n_tok * nsb) * 4);
  int32_t* o = out.data();
  for (int64_t t = 0; t < n_tok; ++t) {
    const auto* blocks = reinterpret_cast<const block_q8_K*>(a + size_t(t) * a_stride);
    for (int64_t sb = 0; sb < nsb; ++sb, o += 4) {
      const __m128i b = load16(blocks[sb].bsums);
      const __m128i c = load16(blocks[sb].bsums + 8);
      const __m128i p = _mm_packs_epi32(_mm_madd_epi16(b, _mm_set1_epi16(1)), _mm_madd_epi16(c, _mm_set1_epi16(1)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o), _mm_shuffle_epi8(p, _mm_setr_epi8(0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15)));
    }
  }
}

// The sub-block's groups summed in int16, G at a time, then one vpmaddwd with the scale: G
// groups are 2 G products a lane, at most 2 G * qmax * 128 (Q4_K: G = 8, 16 * 15 * 128 = 30720;
// Q5_K: G = 4, 8 * 31 * 128 = 31744).
template <int T, int G>
void q45K_tokens(const TileQ45K& tile, const uint8_t* a, size_t a_stride, const int32_t* pairs, size_t pairs_stride,
                 float* y, int64_t ldy, const RowTile& rt, bool first) {
  static_assert(G == 4 || G == 8);
  const uint8_t* at[T];
  for (int t = 0; t < T; ++t) at[t] = a + size_t(t) * a_stride;
  __m256i sumi[T];
  for (int t = 0; t < T; ++t) sumi[t] = _mm256_setzero_si256();
  for (int s = 0; s < 8; ++s) {
    for (int g0 = 0; g0 < 8; g0 += G) {
      __m256i part[T];
      for (int t = 0; t < T; ++t)
        part[t] = _mm256_maddubs_epi16(tile.q[8 * s + g0], bcast4(at[t] + kQ8KQs + 32 * s + 4 * g0));
      for (int g = g0 + 1; g < g0 + G; ++g) {
        const __m256i w = tile.q[8 * s + g];
        for (int t = 0; t < T; ++t) {
          part[t] = _mm256_add_epi16(part[t], _mm256_maddubs_epi16(w, bcast4(at[t] + kQ8KQs + 32 * s + 4 * g)));
          // the last group's sum straight into vpmaddwd; the others kept in order, in registers
          if (g == g0 + G - 1)
            sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(part[t], tile.sc[s]));
          else
            part[t] = opaque(part[t]);
        }
      }
    }
  }
  for (int t = 0; t < T; ++t) {
    const int32_t* p = pairs + size_t(t) * pairs_stride;
    __m256i mins = _mm256_setzero_si256();
    for (int k = 0; k < 4; ++k) mins = _mm256_add_epi32(mins, _mm256_madd_epi16(tile.mins[k], _mm256_set1_epi32(p[k])));
    const __m256 v = _mm256_fmsub_ps(_mm256_cvtepi32_ps(sumi[t]), tile.d, _mm256_mul_ps(_mm256_cvtepi32_ps(mins), tile.dmin));
    float da;
    std::memcpy(&da, at[t] + offsetof(block_q8_K, d), 4);
    update_rows(y + t * ldy, rt, v, _mm256_set1_ps(da), first);
  }
}

template <class Block>
void gemm_q45K(int64_t n, const void* w, size_t w_stride, int64_t n_rows, const void* a, size_t a_stride,
               int64_t n_tok, float* y, int64_t ldy) {
  constexpr int G = std::is_same_v<Block, block_q5_K> ? 4 : 8;
  const int64_t nsb = n / QK_K;
  const auto* ab = static_cast<const uint8_t*>(a);
  thread_local std::vector<int32_t> pairs;
  bsum_pairs(ab, a_stride, n_tok, nsb, pairs);
  alignas(32) TileQ45K tile;
  for (int64_t r0 = 0; r0 < n_rows; r0 += kRows) {
    const RowTile rt = row_tile(w, w_stride, r0, n_rows);
    for (int64_t sb = 0; sb < nsb; ++sb) {
      if (sb + 1 < nsb) prefetch_blocks(rt, size_t(sb + 1) * sizeof(Block), sizeof(Block));
      else if (r0 + kRows < n_rows) prefetch_blocks(row_tile(w, w_stride, r0 + kRows, n_rows), 0, sizeof(Block));
      unpack_q45K<Block>(rt, sb, tile);
      for_token_blocks(n_tok, [&](auto T, int64_t t0) {
        q45K_tokens<decltype(T)::value, G>(tile, ab + size_t(t0) * a_stride + size_t(sb) * sizeof(block_q8_K), a_stride,
                                           pairs.data() + size_t(t0 * nsb + sb) * 4, size_t(nsb) * 4, y + t0 * ldy + r0,
                                           ldy, rt, sb == 0);
      });
    }
  }
}

// ---- Q6_K ----

struct TileQ6K {
  __m256i q[64];      // group g: lane r = stored quants (q + 32, 0..63) 4g .. 4g + 3 of row r
  __m256i sc[16];     // int16 pairs (sc, sc) per row
  __m256i offset[8];  // int16 pairs per row: (-32 sc_2p, -32 sc_2p+1), against the bsums pairs
  __m256 d;
};

void unpack_q6K(const RowTile& rt, int64_t sb, TileQ6K& tile) {
  const size_t base = size_t(sb) * sizeof(block_q6_K);
  const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
  __m256i qh[2][8];
  for (int h = 0; h < 2; ++h) load_transposed(rt.rows, base + offsetof(block_q6_K, qh) + 32 * size_t(h), qh[h]);
  for (int h = 0; h < 2; ++h) {
    for (int c = 0; c < 2; ++c) {
      __m256i ql[8];
      load_transposed(rt.rows, base + offsetof(block_q6_K, ql) + 64 * size_t(h) + 32 * size_t(c), ql);
      // element 128h + 32k + l (group 32h + 8k + m, l = 4m + i): low 4 bits in nibble k / 2 of
      // ql[64h + 32 (k % 2) + l], high 2 bits at bit 2k of qh[32h + l]; here k % 2 = c
      for (int k = c; k < 4; k += 2) {
        for (int m = 0; m < 8; ++m) {
          const __m256i low = k < 2 ? _mm256_and_si256(ql[m], m4) : _mm256_and_si256(_mm256_srli_epi32(ql[m], 4), m4);
          const __m256i hb = qh[h][m];
          __m256i high;
          switch (k) {
            case 0: high = _mm256_slli_epi32(hb, 4); break;
            case 1: high = _mm256_slli_epi32(hb, 2); break;
            case 2: high = hb; break;
            default: high = _mm256_srli_epi32(hb, 2); break;
          }
          tile.q[32 * h + 8 * k + m] = _mm256_or_si256(low, _mm256_and_si256(high, m30));
        }
      }
    }
  }
  alignas(32) int32_t v[kRows];
  alignas(32) uint16_t d[kRows];
  for (int s = 0; s < 16; ++s) {
    for (int i = 0; i < kRows; ++i) {
      const int sc = reinterpret_cast<const block_q6_K*>(rt.rows[i] + base)->scales[s];
      v[i] = int32_t(uint32_t(uint16_t(sc)) * 0x10001u);
    }
    tile.sc[s] = load_ints(v);
  }
  for (int p = 0; p < 8; ++p) {
    for (int i = 0; i < kRows; ++i) {
      const int8_t* sc = reinterpret_cast<const block_q6_K*>(rt.rows[i] + base)->scales;
      v[i] = int32_t(uint32_t(uint16_t(-32 * sc[2 * p])) | uint32_t(uint16_t(-32 * sc[2 * p + 1])) << 16);
    }
    tile.offset[p] = load_ints(v);
  }
  for (int i = 0; i < kRows; ++i) d[i] = reinterpret_cast<const block_q6_K*>(rt.rows[i] + base)->d;
  tile.d = load_halves(d);
}

template <int T>
void q6K_tokens(const TileQ6K& tile, const uint8_t* a, size_t a_stride, float* y, int64_t ldy, const RowTile& rt,
                bool first) {
  const uint8_t* at[T];
  for (int t = 0; t < T; ++t) at[t] = a + size_t(t) * a_stride;
  __m256i sumi[T];
  // the offset term first: -32 sum_s sc_s bsums_s
  for (int t = 0; t < T; ++t) {
    sumi[t] = _mm256_setzero_si256();
    for (int p = 0; p < 8; ++p)
      sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(tile.offset[p], bcast4(at[t] + kQ8KBsums + 4 * p)));
  }
  for (int s = 0; s < 16; ++s) {
    const __m256i sc = tile.sc[s];
    // two groups summed in int16 (4 products a lane, |sum| <= 4 * 63 * 128 = 32256), then one
    // vpmaddwd with the scale
    for (int g = 0; g < 4; g += 2) {
      const __m256i w0 = tile.q[4 * s + g], w1 = tile.q[4 * s + g + 1];
      for (int t = 0; t < T; ++t) {
        const uint8_t* x = at[t] + kQ8KQs + 16 * s + 4 * g;
        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(w0, bcast4(x)), _mm256_maddubs_epi16(w1, bcast4(x + 4)));
        sumi[t] = opaque(_mm256_add_epi32(sumi[t], _mm256_madd_epi16(p, sc)));
      }
    }
  }
  for (int t = 0; t < T; ++t) {
    float da;
    std::memcpy(&da, at[t] + offsetof(block_q8_K, d), 4);
    update_rows(y + t * ldy, rt, _mm256_mul_ps(_mm256_cvtepi32_ps(sumi[t]), tile.d), _mm256_set1_ps(da), first);
  }
}

void gemm_q6K(int64_t n, const void* w, size_t w_stride, int64_t n_rows, const void* a, size_t a_stride,
              int64_t n_tok, float* y, int64_t ldy) {
  const int64_t nsb = n / QK_K;
  const auto* ab = static_cast<const uint8_t*>(a);
  alignas(32) TileQ6K tile;
  for (int64_t r0 = 0; r0 < n_rows; r0 += kRows) {
    const RowTile rt = row_tile(w, w_stride, r0, n_rows);
    for (int64_t sb = 0; sb < nsb; ++sb) {
      if (sb + 1 < nsb) prefetch_blocks(rt, size_t(sb + 1) * sizeof(block_q6_K), sizeof(block_q6_K));
      else if (r0 + kRows < n_rows) prefetch_blocks(row_tile(w, w_stride, r0 + kRows, n_rows), 0, sizeof(block_q6_K));
      unpack_q6K(rt, sb, tile);
      for_token_blocks(n_tok, [&](auto T, int64_t t0) {
        q6K_tokens<decltype(T)::value>(tile, ab + size_t(t0) * a_stride + size_t(sb) * sizeof(block_q8_K), a_stride,
                                       y + t0 * ldy + r0, ldy, rt, sb == 0);
      });
    }
  }
}

// ---- 32-element formats against Q8_0 activations: Q8_0, Q4_0, IQ4_NL, MXFP4 ----
//
// Each block has its own scale, so the integer sum of a block (8 groups of 4 quants, 8 rows)
// becomes a float per block and token. Two ways into vpmaddubsw (u8 x s8), by the values' range:
//  - offset (Q4_0: value + 8, 0 .. 15; MXFP4: doubled E2M1 + 12, 0 .. 24): unsigned, the pair
//    sums of G groups added in int16 (Q4_0 8: 16 * 15 * 127 = 30480; MXFP4 4: 8 * 24 * 127 =
//    24384), one vpmaddwd; the offset taken off as offset * the block's activation sum;
//  - signed (Q8_0, IQ4_NL: to -128 / -127): |w| against the activations signed as w, one
//    vpmaddwd per group (a pair is at most 2 * 128 * 127 = 32512: Q8_0 activations are within
//    +-127, as ggml's quantizer makes them; only a block whose scale underflows to 0 can hold
//    -128, and it adds 0 whatever its integer sum).
// The integer sums are the reference's; the float part differs by rounding order only.
//
// The rows come from the file layout (an 8 x 8 dword transpose per block, the scales gathered
// row by row) or from a row-interleaved group (cpu/repack.h: these four formats are interleaved
// where the weights are read into RAM), where register k of a block is one load and the 8 rows'
// scales another. A panel of up to kPanelBlocks blocks of the 8 rows is unpacked once into
// scratch, and each block of 4 tokens runs over it. One token on a group (decode) takes the same
// sums straight from the loads, without the scratch: against the file layout's matrix-vector
// kernel (vec_dot row by row), one thread in L2 reads 2.0-2.4x the bytes a second (MXFP4, Q4_0,
// Q8_0 on Zen 3).
//
// Every token, at any token count, takes the same operations in the same order (block by block
// into a float accumulator per row, added into y at each panel's end), so its result is
// bit-identical to its one-token result, as KernelTable::gemm_interleaved must be (it serves
// decode and verification steps too; the file layout's kernel is taken above
// kBatchInvariantTokens only).

constexpr int kPanelBlocks = 64;  // 2048 elements: 16 KB of quants in L1
constexpr int kGroupRows = 16;    // cpu/repack.h kInterleaveRows

struct Panel32 {
  __m256i q[kPanelBlocks * 8];
  __m256 d[kPanelBlocks];
};
// One per thread for all four formats (18 KB of thread-local storage).
Panel32& panel_scratch() {
  thread_local Panel32 panel;
  return panel;
}

// The 16 bytes at rows[i] + offset of each row, transposed: r[j] lane i = dword j of row i.
inline void load_transposed_16(const uint8_t* const rows[kRows], size_t offset, __m256i r[4]) {
  __m256i x[4], t[4];
#pragma GCC unroll 8
  for (int i = 0; i < 4; ++i) x[i] = _mm256_set_m128i(load16(rows[i + 4] + offset), load16(rows[i] + offset));
  t[0] = _mm256_unpacklo_epi32(x[0], x[1]);  // rows 0, 1 (4, 5): dwords 0, 1
  t[1] = _mm256_unpackhi_epi32(x[0], x[1]);  // dwords 2, 3
  t[2] = _mm256_unpacklo_epi32(x[2], x[3]);
  t[3] = _mm256_unpackhi_epi32(x[2], x[3]);
  r[0] = _mm256_unpacklo_epi64(t[0], t[2]);
  r[1] = _mm256_unpackhi_epi64(t[0], t[2]);
  r[2] = _mm256_unpacklo_epi64(t[1], t[3]);
  r[3] = _mm256_unpackhi_epi64(t[1], t[3]);
}

// The f16 scale at the start of each row's block at `offset`.
inline __m256 half_scales(const RowTile& rt, size_t offset) {
  alignas(32) uint16_t d[kRows];
  for (int i = 0; i < kRows; ++i) std::memcpy(&d[i], rt.rows[i] + offset, 2);
  return load_halves(d);
}

// e8m0_half of 8 exponent bytes (int32 lanes): 2^(e - 128), e = 0 and 1 as denormals.
inline __m256 e8m0_halves(__m256i e) {
  const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
  const __m256i tiny = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
  return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, tiny, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e)));
}

// Nibble formats: element j of a block in the low nibble of qs[j], j + 16 in the high nibble;
// each nibble mapped through table (16 bytes: its value, or value + offset), or kept (null). r[k]:
// lane i = dword k of row i's quant bytes.
inline void nibbles(const __m256i r[4], const int8_t* table, __m256i q[8]) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
#pragma GCC unroll 8
  for (int j = 0; j < 4; ++j) {
    q[j] = _mm256_and_si256(r[j], m4);
    q[4 + j] = _mm256_and_si256(_mm256_srli_epi32(r[j], 4), m4);
  }
  if (table == nullptr) return;
  const __m256i lut = _mm256_broadcastsi128_si256(load16(table));
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) q[j] = _mm256_shuffle_epi8(lut, q[j]);
}
// The same from a row-interleaved group: the 4 quant registers at qs, 64 bytes apart.
inline void group_nibbles(const uint8_t* qs, const int8_t* table, __m256i q[8]) {
  __m256i r[4];
#pragma GCC unroll 8
  for (int k = 0; k < 4; ++k) r[k] = load32(qs + 64 * k);
  nibbles(r, table, q);
}
template <class Block>
void file_nibbles(const RowTile& rt, int64_t b, const int8_t* table, __m256i q[8]) {
  __m256i r[4];
  load_transposed_16(rt.rows, size_t(b) * sizeof(Block) + offsetof(Block, qs), r);
  nibbles(r, table, q);
}

// Each format: unpack (block b of a file-layout tile) and unpack_group (a block of a group: its
// 8 rows' scales at head, quant register k at qs + 64 k) give q[g] (lane r: the values of quants
// 4g .. 4g + 3 of row r, as the kernel multiplies them) and the rows' scales d; kHead bytes of
// scale per block and row, units of kUnit blocks in a group (cpu/repack.h).
struct Q8_0Fmt {
  static constexpr bool kSigned = true;
  static constexpr int kOffset = 0, kGroups = 1;
  static constexpr size_t kBlock = sizeof(block_q8_0), kHead = 2, kUnit = 2;
  static void unpack(const RowTile& rt, int64_t b, __m256i q[8], __m256& d) {
    load_transposed(rt.rows, size_t(b) * kBlock + offsetof(block_q8_0, qs), q);
    d = half_scales(rt, size_t(b) * kBlock);
  }
  static void unpack_group(const uint8_t* head, const uint8_t* qs, __m256i q[8], __m256& d) {
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) q[g] = load32(qs + 64 * g);
    d = _mm256_cvtph_ps(load16(head));
  }
};
struct Q4_0Fmt {  // the nibbles are the values + 8
  static constexpr bool kSigned = false;
  static constexpr int kOffset = 8, kGroups = 8;
  static constexpr size_t kBlock = sizeof(block_q4_0), kHead = 2, kUnit = 2;
  static void unpack(const RowTile& rt, int64_t b, __m256i q[8], __m256& d) {
    file_nibbles<block_q4_0>(rt, b, nullptr, q);
    d = half_scales(rt, size_t(b) * kBlock);
  }
  static void unpack_group(const uint8_t* head, const uint8_t* qs, __m256i q[8], __m256& d) {
    group_nibbles(qs, nullptr, q);
    d = _mm256_cvtph_ps(load16(head));
  }
};
struct Iq4NlFmt {
  static constexpr bool kSigned = true;
  static constexpr int kOffset = 0, kGroups = 1;
  static constexpr size_t kBlock = sizeof(block_iq4_nl), kHead = 2, kUnit = 2;
  static void unpack(const RowTile& rt, int64_t b, __m256i q[8], __m256& d) {
    file_nibbles<block_iq4_nl>(rt, b, kvalues_iq4nl, q);
    d = half_scales(rt, size_t(b) * kBlock);
  }
  static void unpack_group(const uint8_t* head, const uint8_t* qs, __m256i q[8], __m256& d) {
    group_nibbles(qs, kvalues_iq4nl, q);
    d = _mm256_cvtph_ps(load16(head));
  }
};
inline constexpr int8_t kMxfp4Offset[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};  // + 12
struct Mxfp4Fmt {
  static constexpr bool kSigned = false;
  static constexpr int kOffset = 12, kGroups = 4;
  static constexpr size_t kBlock = sizeof(block_mxfp4), kHead = 1, kUnit = 4;
  static void unpack(const RowTile& rt, int64_t b, __m256i q[8], __m256& d) {
    file_nibbles<block_mxfp4>(rt, b, kMxfp4Offset, q);
    const size_t e = size_t(b) * kBlock + offsetof(block_mxfp4, e);
    d = e8m0_halves(_mm256_setr_epi32(rt.rows[0][e], rt.rows[1][e], rt.rows[2][e], rt.rows[3][e], rt.rows[4][e],
                                      rt.rows[5][e], rt.rows[6][e], rt.rows[7][e]));
  }
  static void unpack_group(const uint8_t* head, const uint8_t* qs, __m256i q[8], __m256& d) {
    group_nibbles(qs, kMxfp4Offset, q);
    d = e8m0_halves(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(head))));
  }
};

// Where block b of a row-interleaved group (nb blocks a row) keeps the scales and the quant
// registers of the rows 8 half .. 8 half + 7 (cpu/repack.h: units of F::kUnit blocks, each the
// 16 rows' heads, then the dwords: dword k of block j of the unit, row i, at 16 m head +
// 64 (j nd + k) + 4 i for a unit of m blocks).
template <class F>
struct GroupBlock {
  const uint8_t *head, *qs;
  GroupBlock(const uint8_t* group, int64_t nb, int64_t b, int half) {
    const int64_t ub = b / int64_t(F::kUnit) * int64_t(F::kUnit), m = std::min<int64_t>(F::kUnit, nb - ub), j = b - ub;
    const uint8_t* base = group + size_t(ub) * F::kBlock * kGroupRows;
    head = base + (size_t(j) * kGroupRows + size_t(kRows * half)) * F::kHead;
    qs = base + size_t(m) * kGroupRows * F::kHead + size_t(j) * (F::kBlock - F::kHead) * kGroupRows + size_t(kRows * half) * 4;
  }
};

// Weights asked for ahead of the decode kernel (bytes): the hardware prefetchers alone leave a
// thread short of the bandwidth a GEMV needs (as kernels.cpp kPrefetchBytes).
constexpr size_t kDecodeAhead = 4096;

// The 8 rows of a tile: FileRows32 as the file has them, GroupRows32 one half of a row-interleaved
// group (w at the first group, n_rows a multiple of 16).
template <class F>
struct FileRows32 {
  RowTile rt;
  FileRows32(const void* w, size_t w_stride, int64_t r0, int64_t n_rows, int64_t /*nb*/)
      : rt(row_tile(w, w_stride, r0, n_rows)) {}
  void unpack(int64_t b, __m256i q[8], __m256& d) const { F::unpack(rt, b, q, d); }
};
template <class F>
struct GroupRows32 {
  RowTile rt;  // its mask and count (a group's rows are all real)
  const uint8_t* group;
  int64_t nb;
  int half;
  GroupRows32(const void* w, size_t w_stride, int64_t r0, int64_t n_rows, int64_t nb_)
      : rt(row_tile(w, w_stride, r0, n_rows)),
        group(static_cast<const uint8_t*>(w) + size_t(r0 / kGroupRows * kGroupRows) * w_stride),
        nb(nb_),
        half(int(r0 / kRows % 2)) {}
  void unpack(int64_t b, __m256i q[8], __m256& d) const {
    const GroupBlock<F> at(group, nb, b, half);
    F::unpack_group(at.head, at.qs, q, d);
  }
  // decode: the group's stream (the next groups follow it) kDecodeAhead ahead of block b, whose
  // share of a group is 16 blocks' bytes
  void prefetch(int64_t b) const {
    constexpr size_t kShare = F::kBlock * kGroupRows;
    const size_t from = (size_t(b) * kShare + kDecodeAhead) & ~size_t(63), to = size_t(b + 1) * kShare + kDecodeAhead;
    for (size_t o = from; o < to; o += 64) _mm_prefetch(reinterpret_cast<const char*>(group + o), _MM_HINT_T0);
  }
};

// Per token and block of the Q8_0 activations, the sum of its 32 quants (offset formats).
void block_sums(const uint8_t* a, size_t a_stride, int64_t n_tok, int64_t nb, std::vector<int32_t>& out) {
  out.resize(size_t(n_tok * nb));
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  for (int64_t t = 0; t < n_tok; ++t) {
    const auto* blocks = reinterpret_cast<const block_q8_0*>(a + size_t(t) * a_stride);
    for (int64_t b = 0; b < nb; ++b) {
      const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, load32(blocks[b].qs)), ones16);
      const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
      const __m128i q = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
      out[size_t(t * nb + b)] = _mm_cvtsi128_si32(_mm_add_epi32(q, _mm_shuffle_epi32(q, 0xB1)));
    }
  }
}

// The int32 sums of one block of the 8 rows (lanes) with T tokens: at[t] the token's block, sum[t]
// its activation sum (offset formats).
template <class F, int T>
inline void block_isum(const __m256i q[8], const uint8_t* const at[T], const int32_t sum[T], __m256i isum[T]) {
  const __m256i ones16 = _mm256_set1_epi16(1);
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
  if constexpr (F::kSigned) {
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
      const __m256i w = q[g], wa = _mm256_abs_epi8(w);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const __m256i x = _mm256_sign_epi8(bcast4(at[t] + offsetof(block_q8_0, qs) + 4 * g), w);
        const __m256i v = _mm256_madd_epi16(_mm256_maddubs_epi16(wa, x), ones16);
        isum[t] = _mm256_add_epi32(isum[t], v);
        if (g < 7) isum[t] = opaque(isum[t]);
      }
    }
  } else {
    constexpr int G = F::kGroups;
#pragma GCC unroll 8
    for (int g0 = 0; g0 < 8; g0 += G) {
      __m256i part[T];
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t)
        part[t] = _mm256_maddubs_epi16(q[g0], bcast4(at[t] + offsetof(block_q8_0, qs) + 4 * g0));
#pragma GCC unroll 8
      for (int g = g0 + 1; g < g0 + G; ++g) {
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
          part[t] = _mm256_add_epi16(part[t], _mm256_maddubs_epi16(q[g], bcast4(at[t] + offsetof(block_q8_0, qs) + 4 * g)));
          if (g < g0 + G - 1) part[t] = opaque(part[t]);
        }
      }
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(part[t], ones16));
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) isum[t] = _mm256_sub_epi32(isum[t], _mm256_set1_epi32(F::kOffset * sum[t]));
  }
}

// acc += isum * d * the token block's scale (every path's float step).
inline __m256 add_block(__m256 acc, __m256i isum, __m256 d, const uint8_t* at) {
  uint16_t da;
  std::memcpy(&da, at, 2);
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, _mm256_set1_ps(half_to_float(da))), acc);
}

// Tokens t0 .. t0 + T against the panel's nblk blocks: a at the panel's first block of token t0,
// sums (offset formats) at its first block's sum.
template <class F, int T>
void tokens_32(const Panel32& p, int nblk, const uint8_t* a, size_t a_stride, const int32_t* sums, size_t sums_stride,
               float* y, int64_t ldy, const RowTile& rt, bool first) {
  __m256 acc[T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int b = 0; b < nblk; ++b) {
    const uint8_t* at[T];
    int32_t sum[T] = {};
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      at[t] = a + size_t(t) * a_stride + size_t(b) * sizeof(block_q8_0);
      if constexpr (!F::kSigned) sum[t] = sums[size_t(t) * sums_stride + size_t(b)];
    }
    __m256i isum[T];
    block_isum<F, T>(p.q + 8 * b, at, sum, isum);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[t] = add_block(acc[t], isum[t], p.d[b], at[t]);
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) update_rows(y + t * ldy, rt, acc[t], _mm256_set1_ps(1.0f), first);
}

// One token on a row-interleaved group: tokens_32 for T = 1 without the panel, straight from
// the loads, the group's two 8-row halves block by block. (One half after the other over each
// panel, the second from cache: 0.7-0.8x the speed in L2.)
template <class F>
void decode_group(const GroupRows32<F> (&rows)[2], int64_t nb, const uint8_t* a, const int32_t* sums, float* y) {
  for (int64_t b0 = 0; b0 < nb; b0 += kPanelBlocks) {
    const int64_t b1 = std::min<int64_t>(nb, b0 + kPanelBlocks);
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = b0; b < b1; ++b) {
      rows[0].prefetch(b);
      const uint8_t* at[1] = {a + size_t(b) * sizeof(block_q8_0)};
      const int32_t sum[1] = {F::kSigned ? 0 : sums[b]};
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        __m256i q[8], isum[1];
        __m256 d;
        rows[h].unpack(b, q, d);
        block_isum<F, 1>(q, at, sum, isum);
        acc[h] = add_block(acc[h], isum[0], d, at[0]);
      }
    }
    for (int h = 0; h < 2; ++h) update_rows(y + kRows * h, rows[h].rt, acc[h], _mm256_set1_ps(1.0f), b0 == 0);
  }
}

template <class F, bool kInterleaved>
void gemm_32(int64_t n, const void* w, size_t w_stride, int64_t n_rows, const void* a, size_t a_stride,
             int64_t n_tok, float* y, int64_t ldy) {
  using Rows = std::conditional_t<kInterleaved, GroupRows32<F>, FileRows32<F>>;
  const int64_t nb = n / 32;
  const auto* ab = static_cast<const uint8_t*>(a);
  thread_local std::vector<int32_t> sums;
  if constexpr (!F::kSigned) block_sums(ab, a_stride, n_tok, nb, sums);
  if constexpr (kInterleaved) {
    if (n_tok == 1) {
      for (int64_t r0 = 0; r0 < n_rows; r0 += kGroupRows) {
        const Rows rows[2] = {Rows(w, w_stride, r0, n_rows, nb), Rows(w, w_stride, r0 + kRows, n_rows, nb)};
        decode_group<F>(rows, nb, ab, sums.data(), y + r0);
      }
      return;
    }
  }
  Panel32& panel = panel_scratch();
  for (int64_t r0 = 0; r0 < n_rows; r0 += kRows) {
    const Rows rows(w, w_stride, r0, n_rows, nb);
    for (int64_t b0 = 0; b0 < nb; b0 += kPanelBlocks) {
      const int nblk = int(std::min<int64_t>(kPanelBlocks, nb - b0));
      for (int b = 0; b < nblk; ++b) rows.unpack(b0 + b, panel.q + 8 * b, panel.d[b]);
      for_token_blocks(n_tok, [&](auto T, int64_t t0) {
        tokens_32<F, decltype(T)::value>(panel, nblk, ab + size_t(t0) * a_stride + size_t(b0) * sizeof(block_q8_0),
                                         a_stride, F::kSigned ? nullptr : sums.data() + size_t(t0 * nb + b0), size_t(nb),
                                         y + t0 * ldy + r0, ldy, rows.rt, b0 == 0);
      });
    }
  }
}

// ---- Q4_K / Q5_K on row-interleaved groups ----
//
// cpu/repack.h: units of one super-block, no head or tail; register k of super-block sb of a group
// (the 16 rows' dword k, rows 8 half .. 8 half + 7 in the 32 bytes at 32 half) at
// sb * 16 sizeof(Block) + 64 k. Dword 0 is d | dmin << 16, 1 .. 3 the 12 packed scale bytes; Q5_K's
// 4 .. 11 its qh; then (from Q45KRegs::kQs) register kQs + 8h + m holds qs bytes 32h + 4m .. + 4,
// whose low nibbles are elements 4m .. 4m + 3 of sub-block 2h and high nibbles the same of sub-block
// 2h + 1 (Q5_K: their fifth bits are bits 2h and 2h + 1 of qh register 4 + m). Both paths below make
// the integer sums of the file layout's kernel exactly, and the same float steps per super-block and
// token (q45K_tokens: v = isum d - imins dmin, then y = v da, or y + v da), so a token's result does
// not depend on how many tokens came with it (KernelTable::gemm_interleaved).

template <class Block>
struct Q45KRegs {
  static constexpr bool kQ5 = std::is_same_v<Block, block_q5_K>;
  static constexpr size_t kGroupBytes = sizeof(Block) * kGroupRows;
  static constexpr int kQs = kQ5 ? 12 : 4;
  // a sub-block's groups summed in int16 G at a time (q45K_tokens)
  static constexpr int G = kQ5 ? 4 : 8;
  // the quants of position (h, m) of a half's super-block at hb: sub-block 2h's in lo, 2h + 1's in hi
  static void quants(const uint8_t* hb, int h, int m, __m256i& lo, __m256i& hi) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i q = load32(hb + 64 * (kQs + 8 * h + m));
    lo = _mm256_and_si256(q, m4);
    hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
    if constexpr (kQ5) {
      // bit 2h (2h + 1) of each qh byte to bit 4
      const __m256i qh = load32(hb + 64 * (4 + m)), m16 = _mm256_set1_epi8(0x10);
      lo = _mm256_or_si256(
          lo, _mm256_and_si256(h < 2 ? _mm256_slli_epi32(qh, 4 - 2 * h) : _mm256_srli_epi32(qh, 2 * h - 4), m16));
      hi = _mm256_or_si256(
          hi, _mm256_and_si256(h < 2 ? _mm256_slli_epi32(qh, 3 - 2 * h) : _mm256_srli_epi32(qh, 2 * h - 3), m16));
    }
  }
};

// The scales of an 8-row half of a group's super-block (blk: the super-block + 32 half), 8 rows
// at once as ggml's get_scale_min_k4: bytes j of sc_lo / mn_lo are scale and min j (j < 4), of
// sc_hi / mn_hi scale and min 4 + j.
struct Q4KScales {
  __m256i sc_lo, sc_hi, mn_lo, mn_hi;
  __m256 d, dmin;
  explicit Q4KScales(const uint8_t* blk) {
    const __m256i z0 = load32(blk), z1 = load32(blk + 64), z2 = load32(blk + 128), z3 = load32(blk + 192);
    const __m256i m4 = _mm256_set1_epi8(0x0F), m63 = _mm256_set1_epi8(63), m30 = _mm256_set1_epi8(0x30);
    sc_lo = _mm256_and_si256(z1, m63);
    mn_lo = _mm256_and_si256(z2, m63);
    sc_hi = _mm256_or_si256(_mm256_and_si256(z3, m4), _mm256_and_si256(_mm256_srli_epi32(z1, 2), m30));
    mn_hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(z3, 4), m4),
                            _mm256_and_si256(_mm256_srli_epi32(z2, 2), m30));
    // the 8 d halves, then the 8 dmin halves (packs works per 128-bit lane: vpermq restores the order)
    const __m256i dd = _mm256_permute4x64_epi64(
        _mm256_packus_epi32(_mm256_and_si256(z0, _mm256_set1_epi32(0xFFFF)), _mm256_srli_epi32(z0, 16)), 0xD8);
    d = _mm256_cvtph_ps(_mm256_castsi256_si128(dd));
    dmin = _mm256_cvtph_ps(_mm256_extracti128_si256(dd, 1));
  }
  // scale s as an int16 pair (sc, sc) in each row's lane
  __m256i scale_pair(int s) const {
    const __m256i src = s < 4 ? sc_lo : sc_hi;
    const int b = s % 4;
    return _mm256_shuffle_epi8(src, _mm256_setr_epi8(b, -1, b, -1, b + 4, -1, b + 4, -1, b + 8, -1, b + 8, -1, b + 12,
                                                     -1, b + 12, -1, b, -1, b, -1, b + 4, -1, b + 4, -1, b + 8, -1,
                                                     b + 8, -1, b + 12, -1, b + 12, -1));
  }
  // TileQ45K::mins k: int16 pairs (m0, m2), (m1, m3), (m4, m6), (m5, m7)
  __m256i min_pairs(int k) const {
    const __m256i src = k < 2 ? mn_lo : mn_hi;
    return _mm256_and_si256(k % 2 ? _mm256_srli_epi32(src, 8) : src, _mm256_set1_epi32(0x00FF00FF));
  }
};

// TileQ45K of super-block sb of a group's half (no transpose: each register is one or two loads).
template <class Block>
void unpack_q45K_group(const uint8_t* group, int64_t sb, int half, TileQ45K& tile) {
  using R = Q45KRegs<Block>;
  const uint8_t* blk = group + size_t(sb) * R::kGroupBytes + 32 * size_t(half);
#pragma GCC unroll 8
  for (int h = 0; h < 4; ++h)
#pragma GCC unroll 8
    for (int m = 0; m < 8; ++m) R::quants(blk, h, m, tile.q[16 * h + m], tile.q[16 * h + 8 + m]);
  const Q4KScales s(blk);
  for (int k = 0; k < 8; ++k) tile.sc[k] = s.scale_pair(k);
  for (int k = 0; k < 4; ++k) tile.mins[k] = s.min_pairs(k);
  tile.d = s.d;
  tile.dmin = s.dmin;
}

// A decode kernel's software prefetch over the contiguous bytes [next, end) of its call's rows:
// step(p) asks for the lines up to kQ4KAhead past p (p: where the kernel reads now), at most
// kMaxLines a step, so that the first steps of a call ramp up to the distance instead of asking
// for it all at once, and nothing past the call's rows (another thread's) is asked for.
constexpr size_t kQ4KAhead = 16384;
struct StreamAhead {
  static constexpr int kMaxLines = 72;
  uintptr_t next, end;
  StreamAhead(const void* from, const void* to)
      : next(reinterpret_cast<uintptr_t>(from) & ~uintptr_t(63)), end(reinterpret_cast<uintptr_t>(to)) {}
  void step(const void* p) {
    const uintptr_t target = std::min(end, reinterpret_cast<uintptr_t>(p) + kQ4KAhead);
    for (int i = 0; i < kMaxLines && next < target; ++i, next += 64)
      _mm_prefetch(reinterpret_cast<const char*>(next), _MM_HINT_T0);
  }
};

// Decode (one token) on a group: both halves straight from the loads (no tile in memory), a
// sub-block's pair sums in int16 G groups at a time as in q45K_tokens (any order: the sum fits,
// and int16 addition wraps), the group's stream asked for kQ4KAhead ahead.
template <class Block>
void gemv_q45K_group(int64_t nsb, const uint8_t* group, const uint8_t* a, const int32_t* pairs, float* y,
                     StreamAhead& pf) {
  using R = Q45KRegs<Block>;
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* blk = group + size_t(sb) * R::kGroupBytes;
    pf.step(blk);
    const uint8_t* aq = a + size_t(sb) * sizeof(block_q8_K) + kQ8KQs;
    __m256i sumi[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 4
    for (int h = 0; h < 4; ++h) {
      __m256i lo[2], hi[2];
#pragma GCC unroll 8
      for (int m = 0; m < 8; ++m) {
        const __m256i xl = bcast4(aq + 64 * h + 4 * m), xh = bcast4(aq + 64 * h + 32 + 4 * m);
        for (int half = 0; half < 2; ++half) {
          __m256i ql, qu;
          R::quants(blk + 32 * half, h, m, ql, qu);
          const __m256i pl = _mm256_maddubs_epi16(ql, xl), ph = _mm256_maddubs_epi16(qu, xh);
          // in order, in registers (opaque: GCC's reassociated tree spilled half of them)
          lo[half] = opaque(m % R::G == 0 ? pl : _mm256_add_epi16(lo[half], pl));
          hi[half] = opaque(m % R::G == 0 ? ph : _mm256_add_epi16(hi[half], ph));
        }
        if (m % R::G == R::G - 1)
          for (int half = 0; half < 2; ++half) {
            const Q4KScales s(blk + 32 * half);
            sumi[half] = _mm256_add_epi32(
                sumi[half], _mm256_add_epi32(_mm256_madd_epi16(lo[half], s.scale_pair(2 * h)),
                                             _mm256_madd_epi16(hi[half], s.scale_pair(2 * h + 1))));
          }
      }
    }
    const int32_t* p = pairs + 4 * size_t(sb);
    float da;
    std::memcpy(&da, a + size_t(sb) * sizeof(block_q8_K) + offsetof(block_q8_K, d), 4);
    for (int half = 0; half < 2; ++half) {
      const Q4KScales s(blk + 32 * half);
      __m256i mins = _mm256_setzero_si256();
      for (int k = 0; k < 4; ++k)
        mins = _mm256_add_epi32(mins, _mm256_madd_epi16(s.min_pairs(k), _mm256_set1_epi32(p[k])));
      const __m256 v =
          _mm256_fmsub_ps(_mm256_cvtepi32_ps(sumi[half]), s.d, _mm256_mul_ps(_mm256_cvtepi32_ps(mins), s.dmin));
      acc[half] = sb == 0 ? _mm256_mul_ps(v, _mm256_set1_ps(da)) : _mm256_fmadd_ps(v, _mm256_set1_ps(da), acc[half]);
    }
  }
  _mm256_storeu_ps(y, acc[0]);
  _mm256_storeu_ps(y + kRows, acc[1]);
}

// Two to four tokens (a speculative verification's) on a group's half: the decode kernel's loads
// and nibble splits shared by the tokens, each with its own sums (through the tiles, two tokens
// cost 1.3x the file layout's vec_dot_tokens, four 1.1x; this way 1.0x and 0.8x).
template <class Block, int T>
void gemv_q45K_half_tokens(int64_t nsb, const uint8_t* group, int half, const uint8_t* a, size_t a_stride,
                           const int32_t* pairs, size_t pairs_stride, float* y, int64_t ldy, StreamAhead& pf) {
  using R = Q45KRegs<Block>;
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* blk = group + size_t(sb) * R::kGroupBytes;
    pf.step(blk);
    const uint8_t* hb = blk + 32 * size_t(half);
    const uint8_t* aq[T];
    for (int t = 0; t < T; ++t) aq[t] = a + size_t(t) * a_stride + size_t(sb) * sizeof(block_q8_K) + kQ8KQs;
    __m256i sumi[T];
    for (int t = 0; t < T; ++t) sumi[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int h = 0; h < 4; ++h) {
      __m256i lo[T], hi[T];
#pragma GCC unroll 8
      for (int m = 0; m < 8; ++m) {
        __m256i l, u;
        R::quants(hb, h, m, l, u);
        for (int t = 0; t < T; ++t) {
          const __m256i pl = _mm256_maddubs_epi16(l, bcast4(aq[t] + 64 * h + 4 * m));
          const __m256i ph = _mm256_maddubs_epi16(u, bcast4(aq[t] + 64 * h + 32 + 4 * m));
          lo[t] = opaque(m % R::G == 0 ? pl : _mm256_add_epi16(lo[t], pl));
          hi[t] = opaque(m % R::G == 0 ? ph : _mm256_add_epi16(hi[t], ph));
        }
        if (m % R::G == R::G - 1) {
          const Q4KScales s(hb);
          const __m256i sa = s.scale_pair(2 * h), sh = s.scale_pair(2 * h + 1);
          for (int t = 0; t < T; ++t)
            sumi[t] = _mm256_add_epi32(sumi[t],
                                       _mm256_add_epi32(_mm256_madd_epi16(lo[t], sa), _mm256_madd_epi16(hi[t], sh)));
        }
      }
    }
    const Q4KScales s(hb);
    for (int t = 0; t < T; ++t) {
      const int32_t* p = pairs + size_t(t) * pairs_stride + 4 * size_t(sb);
      __m256i mins = _mm256_setzero_si256();
      for (int k = 0; k < 4; ++k)
        mins = _mm256_add_epi32(mins, _mm256_madd_epi16(s.min_pairs(k), _mm256_set1_epi32(p[k])));
      const __m256 v =
          _mm256_fmsub_ps(_mm256_cvtepi32_ps(sumi[t]), s.d, _mm256_mul_ps(_mm256_cvtepi32_ps(mins), s.dmin));
      float da;
      std::memcpy(&da, aq[t] - kQ8KQs + offsetof(block_q8_K, d), 4);
      acc[t] = sb == 0 ? _mm256_mul_ps(v, _mm256_set1_ps(da)) : _mm256_fmadd_ps(v, _mm256_set1_ps(da), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) _mm256_storeu_ps(y + t * ldy, acc[t]);
}

// Interleaved Q4_K / Q5_K: w the first group, n_rows a multiple of 16. One token to
// gemv_q45K_group, two to four to gemv_q45K_half_tokens, more to q45K_tokens over tiles unpacked
// from the group (each half in turn).
template <class Block>
void gemm_q45K_interleaved(int64_t n, const void* w, size_t w_stride, int64_t n_rows, const void* a, size_t a_stride,
                           int64_t n_tok, float* y, int64_t ldy) {
  using R = Q45KRegs<Block>;
  const int64_t nsb = n / QK_K;
  const auto* ab = static_cast<const uint8_t*>(a);
  thread_local std::vector<int32_t> pairs;
  bsum_pairs(ab, a_stride, n_tok, nsb, pairs);
  StreamAhead pf(w, static_cast<const uint8_t*>(w) + size_t(n_rows) * w_stride);
  for (int64_t r0 = 0; r0 < n_rows; r0 += kGroupRows) {
    const uint8_t* group = static_cast<const uint8_t*>(w) + size_t(r0) * w_stride;
    if (n_tok == 1) {
      gemv_q45K_group<Block>(nsb, group, ab, pairs.data(), y + r0, pf);
      continue;
    }
    if (n_tok <= 4) {
      const size_t ps = size_t(nsb) * 4;
      for (int half = 0; half < 2; ++half) {
        float* yh = y + r0 + kRows * half;
        const int32_t* p = pairs.data();
        if (n_tok == 2) gemv_q45K_half_tokens<Block, 2>(nsb, group, half, ab, a_stride, p, ps, yh, ldy, pf);
        else if (n_tok == 3) gemv_q45K_half_tokens<Block, 3>(nsb, group, half, ab, a_stride, p, ps, yh, ldy, pf);
        else gemv_q45K_half_tokens<Block, 4>(nsb, group, half, ab, a_stride, p, ps, yh, ldy, pf);
      }
      continue;
    }
    alignas(32) TileQ45K tile;
    for (int half = 0; half < 2; ++half) {
      const RowTile rt = row_tile(w, w_stride, r0 + kRows * half, n_rows);
      for (int64_t sb = 0; sb < nsb; ++sb) {
        const char* next = reinterpret_cast<const char*>(group + size_t(sb + 1) * R::kGroupBytes + 32 * half);
        for (size_t o = 0; o < R::kGroupBytes; o += 64) _mm_prefetch(next + o, _MM_HINT_T0);
        unpack_q45K_group<Block>(group, sb, half, tile);
        for_token_blocks(n_tok, [&](auto T, int64_t t0) {
          q45K_tokens<decltype(T)::value, R::G>(tile, ab + size_t(t0) * a_stride + size_t(sb) * sizeof(block_q8_K),
                                                a_stride, pairs.data() + size_t(t0 * nsb + sb) * 4, size_t(nsb) * 4,
                                                y + t0 * ldy + r0 + kRows * half, ldy, rt, sb == 0);
        });
      }
    }
  }
}

// ---- F32, F16, BF16 against float activations ----
//
// A chunk of up to kFloatChunk elements of the 8 rows widened to floats and transposed into L1
// (wt[k]: element k of the 8 rows), then per block of up to 8 tokens one FMA per element with the
// broadcast activation: 8 accumulators cover the FMA latency.

constexpr int64_t kFloatChunk = 256;  // 8 KB of widened weights
constexpr int kFloatTok = 8;

// A row's elements as floats: 8 from p, or 1.
struct F32Row {
  static constexpr size_t kBytes = 4;
  static __m256 load8(const uint8_t* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
  static float load1(const uint8_t* p) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
};
struct F16Row {
  static constexpr size_t kBytes = 2;
  static __m256 load8(const uint8_t* p) { return _mm256_cvtph_ps(load16(p)); }
  static float load1(const uint8_t* p) { return half_to_float(uint16_t(p[0] | p[1] << 8)); }
};
struct Bf16Row {
  static constexpr size_t kBytes = 2;
  static __m256 load8(const uint8_t* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load16(p)), 16));
  }
  static float load1(const uint8_t* p) {
    const uint32_t bits = uint32_t(p[0] | p[1] << 8) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
};

// Element k0 + k of the 8 rows as floats, k < kk, into wt[k].
template <class W>
void widen_rows(const RowTile& rt, int64_t k0, int64_t kk, __m256* wt) {
  int64_t k = 0;
  for (; k + 8 <= kk; k += 8) {
    __m256i r[8];
    for (int i = 0; i < kRows; ++i) r[i] = _mm256_castps_si256(W::load8(rt.rows[i] + size_t(k0 + k) * W::kBytes));
    transpose_8x8(r);
    for (int j = 0; j < 8; ++j) wt[k + j] = _mm256_castsi256_ps(r[j]);
  }
  for (; k < kk; ++k) {
    alignas(32) float e[kRows];
    for (int i = 0; i < kRows; ++i) e[i] = W::load1(rt.rows[i] + size_t(k0 + k) * W::kBytes);
    wt[k] = _mm256_load_ps(e);
  }
}

template <int T>
void float_tokens(const __m256* wt, int64_t kk, const uint8_t* a, size_t a_stride, float* y, int64_t ldy,
                  const RowTile& rt, bool first) {
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t k = 0; k < kk; ++k) {
    const __m256 wv = wt[k];
    for (int t = 0; t < T; ++t) {
      float x;
      std::memcpy(&x, a + size_t(t) * a_stride + size_t(k) * sizeof(float), sizeof x);
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(x), wv, acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) update_rows(y + t * ldy, rt, acc[t], _mm256_set1_ps(1.0f), first);
}

template <class W>
void gemm_float(int64_t n, const void* w, size_t w_stride, int64_t n_rows, const void* a, size_t a_stride,
                int64_t n_tok, float* y, int64_t ldy) {
  const auto* ab = static_cast<const uint8_t*>(a);
  alignas(32) __m256 wt[kFloatChunk];
  for (int64_t r0 = 0; r0 < n_rows; r0 += kRows) {
    const RowTile rt = row_tile(w, w_stride, r0, n_rows);
    for (int64_t k0 = 0; k0 < n; k0 += kFloatChunk) {
      const int64_t kk = std::min(kFloatChunk, n - k0);
      widen_rows<W>(rt, k0, kk, wt);
      const uint8_t* ak = ab + size_t(k0) * sizeof(float);
      int64_t t0 = 0;
      auto run = [&](auto T) {
        float_tokens<decltype(T)::value>(wt, kk, ak + size_t(t0) * a_stride, a_stride, y + t0 * ldy + r0, ldy, rt, k0 == 0);
        t0 += decltype(T)::value;
      };
      while (t0 + kFloatTok <= n_tok) run(std::integral_constant<int, kFloatTok>{});
      if (n_tok - t0 >= 4) run(std::integral_constant<int, 4>{});
      if (n_tok - t0 >= 2) run(std::integral_constant<int, 2>{});
      if (n_tok - t0 >= 1) run(std::integral_constant<int, 1>{});
    }
  }
}

}  // namespace

namespace detail {

void add_avx2_gemm(GemmFn* gemm) {
  gemm[size_t(GgmlType::q4_k)] = gemm_q45K<block_q4_K>;
  gemm[size_t(GgmlType::q5_k)] = gemm_q45K<block_q5_K>;
  gemm[size_t(GgmlType::q6_k)] = gemm_q6K;
  gemm[size_t(GgmlType::q8_0)] = gemm_32<Q8_0Fmt, false>;
  gemm[size_t(GgmlType::q4_0)] = gemm_32<Q4_0Fmt, false>;
  gemm[size_t(GgmlType::iq4_nl)] = gemm_32<Iq4NlFmt, false>;
  gemm[size_t(GgmlType::mxfp4)] = gemm_32<Mxfp4Fmt, false>;
  gemm[size_t(GgmlType::f32)] = gemm_float<F32Row>;
  gemm[size_t(GgmlType::f16)] = gemm_float<F16Row>;
  gemm[size_t(GgmlType::bf16)] = gemm_float<Bf16Row>;
}

void add_avx2_gemm_interleaved(GemmFn* gemm) {
  gemm[size_t(GgmlType::q4_k)] = gemm_q45K_interleaved<block_q4_K>;
  gemm[size_t(GgmlType::q5_k)] = gemm_q45K_interleaved<block_q5_K>;
  gemm[size_t(GgmlType::q8_0)] = gemm_32<Q8_0Fmt, true>;
  gemm[size_t(GgmlType::q4_0)] = gemm_32<Q4_0Fmt, true>;
  gemm[size_t(GgmlType::iq4_nl)] = gemm_32<Iq4NlFmt, true>;
  gemm[size_t(GgmlType::mxfp4)] = gemm_32<Mxfp4Fmt, true>;
}

}  // namespace detail
}  // namespace strata::cpu
