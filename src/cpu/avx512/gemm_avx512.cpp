// AVX-512 + VNNI tile kernels (kernels.h GemmFn): Q4_K, Q5_K, Q6_K against Q8_K activations;
// Q8_0, Q4_0, IQ4_NL, MXFP4 against Q8_0 activations; F16, BF16 against float activations. Other
// types fall back to KernelTable::gemm_tile's loop over the AVX-512 vec_dot.
//
// Scheme. The weight rows are taken 16 at a time (one int32 lane per row). For each 256 elements
// (a K super-block, or eight 32-element blocks) the 16 rows' quants are unpacked once into an L1
// tile as unsigned bytes, interleaved: register g holds, in lane r, the four consecutive
// quants 4g .. 4g + 3 of row r (a 16 x 16 dword transpose of the packed bytes, or plain loads of
// the row-interleaved layout, then the format's nibble / bit unpacking). Tiles are unpacked a
// panel at a time (group_panels: up to 40 KB, 2048 elements of Q4_K). Then for each token,
// `vpdpbusd acc, w[g], broadcast(a[4g .. 4g + 4))` adds four products to each of the 16 rows at
// once; a block of up to 8 tokens runs over the whole panel with its sums in registers, so each
// unpacked register is loaded once per 8 tokens, the activations come in as broadcast loads (an
// embedded {1to16} operand, through inline asm, measured 5% slower on Zen 5; GCC 12 emits none)
// and y is written once per panel. The unpacking is paid once per (16 rows, 256 elements) for
// all tokens. Interleaved Q4_K skips the tile: its packed dwords are already one register per
// group pair, and each token block splits the nibbles itself (q4K_packed_tokens).
//
// Math. The integer sums are the reference's exactly (quant_ref.h); the float part differs by
// rounding order only:
//  - weights enter vpdpbusd unsigned, as the stored value q plus an offset (Q8_0: 128, Q4_0: 8,
//    IQ4_NL: 127, MXFP4: 12, codebooks shifted by the offset), and the offset times the block's
//    activation sum is subtracted (the int32 accumulator starts at -offset * sum(a)). Q6_K stores
//    q + 32: each sub-block's int32 sum starts at -32 bsums_s (q6K_offsets), before its scale.
//  - K formats: each sub-block's int32 sum is multiplied by its integer scale (vpmulld) and summed
//    in int32 over the super-block; Q4_K / Q5_K's min term sum_s m_s (bsums_2s + bsums_2s+1) is
//    an int32 vpdpwssd. One float conversion per super-block and token:
//    y += da * (d * isum - dmin * imins) (the reference: (d da) isum - (dmin da) imins).
//  - 32-element formats: per block y += (float(isum) * da) * d (the reference: isum (d da)).
// No int32 sum can overflow: |isum| <= 256 * 63 * 128 * 63 for Q6_K, less elsewhere.
//
// Reentrant: scratch on the stack and in thread_local buffers (the per-call token-side sums).
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

constexpr int kRows = 16;  // weight rows per tile: one int32 lane each
constexpr int kTok = 8;    // tokens per register block (for_token_blocks has a case for each size below)

inline __m512i load64(const void* p) { return _mm512_loadu_si512(p); }
inline int32_t load_i32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
// Four activation bytes broadcast to every lane (an embedded {1to16} broadcast of vpdpbusd).
inline __m512i bcast4(const void* p) { return _mm512_set1_epi32(load_i32(p)); }
// p + d where the result lies in another buffer than p's (pointer arithmetic across objects is
// undefined; in integers it is not)
inline const uint8_t* at_offset(const uint8_t* p, ptrdiff_t d) {
  return reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(p) + uintptr_t(d));
}

// Runs fn(std::integral_constant<int, T>, t0) over the tokens in blocks of at most kTok, as even
// as they can be: 33 tokens as 7 + 7 + 7 + 6 + 6, not 8 + 8 + 8 + 8 + 1, since a block of T
// tokens loads the panel's weights once for all T and keeps T independent accumulator chains
// (routed experts in a 512-token prefill see about 32 tokens each, and the short tails cost 8% of
// their time). A token's sums do not depend on its block.
// kMax: the largest block (kTok, or 4 for the two-group kernels).
template <int N, class Fn>
inline void token_block_of_size(int64_t size, int64_t t, Fn& fn) {
  if constexpr (N > 1) {
    if (size < N) return token_block_of_size<N - 1>(size, t, fn);
  }
  fn(std::integral_constant<int, N>{}, t);
}
template <int kMax = kTok, class Fn>
inline void for_token_blocks(int64_t n_tok, Fn&& fn) {
  const int64_t n_blocks = (n_tok + kMax - 1) / kMax;
  for (int64_t b = 0, t = 0; b < n_blocks; ++b) {
    const int64_t size = n_tok / n_blocks + (b < n_tok % n_blocks ? 1 : 0);
    token_block_of_size<kMax>(size, t, fn);
    t += size;
  }
}

// In place: r[i] holds the dwords (i, 0..15) of a 16 x 16 matrix; afterwards r[j] holds (0..15, j).
inline void transpose_16x16(__m512i r[16]) {
  __m512i t[16], c[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  // c[4G + m]: rows 4G .. 4G + 3 of column 4L + m in 128-bit lane L
  for (int g = 0; g < 16; g += 4) {
    c[g + 0] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
    c[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
    c[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
    c[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
  }
  for (int m = 0; m < 4; ++m) {
    const __m512i x0 = _mm512_shuffle_i32x4(c[m], c[4 + m], 0x88);
    const __m512i x1 = _mm512_shuffle_i32x4(c[m], c[4 + m], 0xDD);
    const __m512i y0 = _mm512_shuffle_i32x4(c[8 + m], c[12 + m], 0x88);
    const __m512i y1 = _mm512_shuffle_i32x4(c[8 + m], c[12 + m], 0xDD);
    r[m] = _mm512_shuffle_i32x4(x0, y0, 0x88);
    r[8 + m] = _mm512_shuffle_i32x4(x0, y0, 0xDD);
    r[4 + m] = _mm512_shuffle_i32x4(x1, y1, 0x88);
    r[12 + m] = _mm512_shuffle_i32x4(x1, y1, 0xDD);
  }
}

// The 64 bytes at p[i] + offset of each row, transposed: r[j] lane i = dword j of row i.
inline void load_transposed(const uint8_t* const rows[kRows], size_t offset, __m512i r[16]) {
  for (int i = 0; i < kRows; ++i) r[i] = load64(rows[i] + offset);
  transpose_16x16(r);
}

// The 16 bytes at rows[i] + offset, transposed: z[k] lane i = dword k of row i (k < 4).
inline void load_transposed_16x4(const uint8_t* const rows[kRows], size_t offset, __m512i z[4]) {
  __m512i a[4];
  for (int q = 0; q < 4; ++q) {
    __m512i v = _mm512_castsi128_si512(load16(rows[4 * q] + offset));
    v = _mm512_inserti32x4(v, load16(rows[4 * q + 1] + offset), 1);
    v = _mm512_inserti32x4(v, load16(rows[4 * q + 2] + offset), 2);
    a[q] = _mm512_inserti32x4(v, load16(rows[4 * q + 3] + offset), 3);
  }
  for (int k = 0; k < 4; ++k) {
    // lane i (and i + 8) <- dword k of row i % 8 of the pair (a[0], a[1]) or (a[2], a[3])
    const __m512i idx = _mm512_set_epi32(28 + k, 24 + k, 20 + k, 16 + k, 12 + k, 8 + k, 4 + k, k,  //
                                         28 + k, 24 + k, 20 + k, 16 + k, 12 + k, 8 + k, 4 + k, k);
    const __m512i lo = _mm512_permutex2var_epi32(a[0], idx, a[1]);
    const __m512i hi = _mm512_permutex2var_epi32(a[2], idx, a[3]);
    z[k] = _mm512_mask_mov_epi32(lo, 0xFF00, hi);
  }
}

// The 16 rows of a tile: rows past the end repeat the last one (their lanes are not stored).
struct RowTile {
  const uint8_t* rows[kRows];
  __mmask16 mask;  // lanes of real rows
};
inline RowTile row_tile(const void* w, size_t w_stride, int64_t r0, int64_t n_rows) {
  RowTile t;
  const int64_t count = std::min<int64_t>(kRows, n_rows - r0);
  for (int i = 0; i < kRows; ++i)
    t.rows[i] = static_cast<const uint8_t*>(w) + size_t(r0 + std::min<int64_t>(i, count - 1)) * w_stride;
  t.mask = __mmask16((1u << count) - 1);
  return t;
}

// y[t * ldy + lanes] (the tile's rows) = v, or += v after the first part of the row.
inline void store_rows(float* y, __mmask16 mask, __m512 v, bool first) {
  if (!first) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, y));
  _mm512_mask_storeu_ps(y, mask, v);
}

// ---- panels ----
//
// Several tokens: a 16-row group's K is cut into panels of up to kPanelBytes of unpacked tiles
// (L1 scratch: 8 super-blocks of Q4_K, 2048 elements). A panel is unpacked once, then each block
// of up to kTok tokens runs over the whole panel with its sums in registers, so y is written once
// per panel. Meanwhile the weights that follow in a row-interleaved group's stream (the next
// panel, or the next group's first) are prefetched into L2, spread over the token blocks, so the
// next unpack does not wait on DRAM. (Measured, one thread, 768 x 2048 Q4_K by 512 tokens: 413 ->
// 593 GOP/s for the panel; sums per 256 elements through y were the previous scheme.)
constexpr size_t kPanelBytes = 40 * 1024;

// Software prefetch of a weight stream's next panel, [from, from + bytes), into L2 (from ==
// nullptr: none), paced: the token kernels step() it, one line a call (the last line again once
// all are asked for), twice per sub-block of their token loop, and after token block i of
// n group_panels catches up to (i + 1) / n of the panel for kernels that step less. Asked for in
// one burst per token block, the lines queued behind each other and the kernel waited on the
// prefetch loop (a third of gemm_q45K's own time, perf of BM_expert_ffn). step() is branch-free:
// GCC keeps the hot loop's accumulators in place around it (see ../avx2/simd_common.h
// PacedPrefetch).
class StreamPrefetch {
 public:
  StreamPrefetch() = default;
  StreamPrefetch(const uint8_t* from, size_t bytes) {
    if (from == nullptr) return;
    begin_ = p_ = reinterpret_cast<uintptr_t>(from) & ~uintptr_t(63);
    end_ = (reinterpret_cast<uintptr_t>(from) + bytes + 63) & ~uintptr_t(63);
    last_ = end_ - 64;
  }
  void step() {
    _mm_prefetch(reinterpret_cast<const char*>(p_), _MM_HINT_T1);
    p_ = p_ < last_ ? p_ + 64 : p_;
  }
  bool empty() const { return begin_ == end_; }
  // at least the first `num / den` of the range asked for
  void catch_up(int64_t num, int64_t den) {
    const uintptr_t to = begin_ + (end_ - begin_) / 64 * uint64_t(num) / uint64_t(den) * 64;
    for (; p_ < to; p_ += 64) _mm_prefetch(reinterpret_cast<const char*>(p_), _MM_HINT_T1);
  }

 private:
  uintptr_t begin_ = 0, p_ = 0, end_ = 0, last_ = 0;  // empty: steps on address 0
};

// What a panel's token blocks prefetch: the units after it, up to a panel of them, or after the
// group's last panel the next group's first, as the row-interleaved layout stores groups one
// after another. A pair of groups has two such ranges (b's gstride after a's), taken one after
// the other: the first half of the token blocks steps through a's, the rest through b's (one
// range, the next pair whole, where K is one panel). stream: the group's unit 0 (nullptr for the
// file layout: no prefetch), unit_bytes a unit's bytes in it.
struct PanelPrefetch {
  StreamPrefetch a, b;
};
inline auto stream_panels(const uint8_t* stream, size_t unit_bytes, int64_t n_units, int64_t panel) {
  return [=](int64_t u) {
    if (stream == nullptr) return PanelPrefetch{};
    const int64_t n = u < n_units ? std::min(panel, n_units - u) : std::min(panel, n_units);
    return PanelPrefetch{StreamPrefetch(stream + size_t(u) * unit_bytes, size_t(n) * unit_bytes), {}};
  };
}
inline auto pair_panels(const uint8_t* stream, size_t gstride, size_t unit_bytes, int64_t n_units, int64_t panel) {
  return [=](int64_t u) {
    if (n_units <= panel) return PanelPrefetch{StreamPrefetch(stream + 2 * gstride, 2 * gstride), {}};
    const int64_t n = u < n_units ? std::min(panel, n_units - u) : panel;
    const uint8_t* p = u < n_units ? stream + size_t(u) * unit_bytes : stream + 2 * gstride;
    return PanelPrefetch{StreamPrefetch(p, size_t(n) * unit_bytes), StreamPrefetch(p + gstride, size_t(n) * unit_bytes)};
  };
}

// One group's (or pair's) panels: unpack(u, tile) fills the tile of unit u (a super-block, or 8
// blocks); tokens(T, t0, tiles, u0, nu, pf) runs tokens t0 .. t0 + T over units u0 .. u0 + nu
// (first panel: u0 == 0), stepping pf: the ranges of next(u0 + nu) (stream_panels, pair_panels).
template <class Tile, int64_t kPanel = std::max<int64_t>(1, int64_t(kPanelBytes / sizeof(Tile))), int kMaxTok = kTok,
          class Next, class Unpack, class Tokens>
void group_panels(int64_t n_units, int64_t n_tok, Next&& next, Unpack&& unpack, Tokens&& tokens) {
  thread_local std::vector<Tile> tiles(kPanel);
  const int64_t n_blocks = (n_tok + kMaxTok - 1) / kMaxTok;
  for (int64_t u0 = 0; u0 < n_units; u0 += kPanel) {
    const int64_t nu = std::min(kPanel, n_units - u0);
    for (int64_t i = 0; i < nu; ++i) unpack(u0 + i, tiles[size_t(i)]);
    PanelPrefetch pf = next(u0 + nu);
    // blocks [0, half) step range a, the rest range b
    const int64_t half = pf.b.empty() ? n_blocks : (n_blocks + 1) / 2;
    int64_t block = 0;
    for_token_blocks<kMaxTok>(n_tok, [&](auto T, int64_t t0) {
      StreamPrefetch& range = block < half ? pf.a : pf.b;
      tokens(T, t0, tiles.data(), u0, nu, range);
      ++block;
      if (block <= half) pf.a.catch_up(block, half);
      else pf.b.catch_up(block - half, n_blocks - half);
    });
    if (half == n_blocks) pf.b.catch_up(1, 1);
  }
}

// ================================ K formats x Q8_K ================================

constexpr size_t kQ8KQs = offsetof(block_q8_K, qs);
constexpr size_t kQ8KBsums = offsetof(block_q8_K, bsums);

// A K super-block of a tile against tokens' Q8_K quants (at[t]: token t's block): for each of S
// sub-blocks of G groups (4 G elements), the G vpdpbusd sums times the sub-block's int32 scale,
// added to sumi[t]. kInit: sub-block s's sums start at the int32 at at[t] + init + 4 s instead of 0
// (one offset from every token's block: one register for the T addresses).
template <int T, int S, int G, bool kInit = false>
inline void scaled_subblocks(const __m512i* q, const __m512i* sc, const uint8_t* const at[T], __m512i sumi[T],
                             StreamPrefetch& pf, ptrdiff_t init = 0) {
  for (int s = 0; s < S; ++s) {
    pf.step();
    if (S <= 8) pf.step();
    __m512i acc[T];
    for (int t = 0; t < T; ++t) acc[t] = kInit ? bcast4(at_offset(at[t], init + 4 * s)) : _mm512_setzero_si512();
    for (int g = 0; g < G; ++g) {
      const __m512i w = q[G * s + g];
      for (int t = 0; t < T; ++t)
        acc[t] = _mm512_dpbusd_epi32(acc[t], w, bcast4(at[t] + kQ8KQs + 4 * (G * s + g)));
    }
    for (int t = 0; t < T; ++t) sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(acc[t], sc[s]));
  }
}

// ---- Q4_K / Q5_K ----

struct ScalesQ45K {
  __m512i sc[8];    // sub-block scales, int32 per row
  __m512i mins[4];  // int16 pairs per row: (m0, m2), (m1, m3), (m4, m6), (m5, m7)
  __m512 d, dmin;
};
struct TileQ45K : ScalesQ45K {
  __m512i q[64];  // group g: lane r = u8 quants 4g .. 4g + 3 of row r (Q5_K: fifth bit added)
};

// Where a tile's 16 rows come from. load16(off, r): r[j] lane i = dword off / 4 + j of row i;
// load4: the same for 4 dwords. off is a byte offset within a row (a multiple of 4).
// FileRows: rows as in the file, transposed here; Interleaved: a row-interleaved group
// (cpu/repack.h), where the transpose was done at load and each register is one plain load.
// Both are made for the 16 rows from r0 on; mask: the lanes of real rows.
struct FileRows {
  RowTile rt;
  __mmask16 mask;
  FileRows(const void* w, size_t w_stride, int64_t r0, int64_t n_rows)
      : rt(row_tile(w, w_stride, r0, n_rows)), mask(rt.mask) {}
  void load16(size_t off, __m512i r[16]) const { load_transposed(rt.rows, off, r); }
  void load4(size_t off, __m512i z[4]) const { load_transposed_16x4(rt.rows, off, z); }
  const uint8_t* stream() const { return nullptr; }
};
struct Interleaved {
  const uint8_t* group;
  __mmask16 mask = 0xFFFF;
  Interleaved(const void* w, size_t w_stride, int64_t r0, int64_t /*n_rows: whole groups*/)
      : group(static_cast<const uint8_t*>(w) + size_t(r0) * w_stride) {}
  void load16(size_t off, __m512i r[16]) const {
    for (int j = 0; j < 16; ++j) r[j] = load64(group + off * kRows + 64 * size_t(j));
  }
  void load4(size_t off, __m512i z[4]) const {
    for (int j = 0; j < 4; ++j) z[j] = load64(group + off * kRows + 64 * size_t(j));
  }
  const uint8_t* stream() const { return group; }
};

// The scales of super-block sb of a tile's 16 rows: d, dmin, and the 6-bit scales and mins.
template <class Block, class Src>
void unpack_q45K_scales(const Src& src, int64_t sb, ScalesQ45K& tile) {
  const size_t base = size_t(sb) * sizeof(Block);
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  // d | dmin << 16, then the 12 packed scale bytes as three dwords (scale_min_k4, 16 rows at once)
  static_assert(offsetof(Block, d) == 0 && offsetof(Block, dmin) == 2 && offsetof(Block, scales) == 4);
  __m512i z[4];
  src.load4(base, z);
  tile.d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(z[0]));
  tile.dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(z[0], 16)));
  const __m512i m63 = _mm512_set1_epi8(63), m30 = _mm512_set1_epi8(0x30);
  const __m512i sc_lo = _mm512_and_si512(z[1], m63);  // bytes sc0 .. sc3
  const __m512i mn_lo = _mm512_and_si512(z[2], m63);  // m0 .. m3
  const __m512i sc_hi = _mm512_or_si512(_mm512_and_si512(z[3], m4), _mm512_and_si512(_mm512_srli_epi32(z[1], 2), m30));
  const __m512i mn_hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(z[3], 4), m4),
                                        _mm512_and_si512(_mm512_srli_epi32(z[2], 2), m30));
  const __m512i byte0 = _mm512_set1_epi32(0xFF), words = _mm512_set1_epi32(0x00FF00FF);
  tile.sc[0] = _mm512_and_si512(sc_lo, byte0);
  tile.sc[1] = _mm512_and_si512(_mm512_srli_epi32(sc_lo, 8), byte0);
  tile.sc[2] = _mm512_and_si512(_mm512_srli_epi32(sc_lo, 16), byte0);
  tile.sc[3] = _mm512_srli_epi32(sc_lo, 24);
  tile.sc[4] = _mm512_and_si512(sc_hi, byte0);
  tile.sc[5] = _mm512_and_si512(_mm512_srli_epi32(sc_hi, 8), byte0);
  tile.sc[6] = _mm512_and_si512(_mm512_srli_epi32(sc_hi, 16), byte0);
  tile.sc[7] = _mm512_srli_epi32(sc_hi, 24);
  tile.mins[0] = _mm512_and_si512(mn_lo, words);
  tile.mins[1] = _mm512_and_si512(_mm512_srli_epi32(mn_lo, 8), words);
  tile.mins[2] = _mm512_and_si512(mn_hi, words);
  tile.mins[3] = _mm512_and_si512(_mm512_srli_epi32(mn_hi, 8), words);
}

template <class Block, bool kFifthBit, class Src>
void unpack_q45K(const Src& src, int64_t sb, TileQ45K& tile) {
  const size_t base = size_t(sb) * sizeof(Block);
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  __m512i qh[16];
  if constexpr (kFifthBit) {
    static_assert(offsetof(Block, qh) + 64 <= sizeof(Block));
    src.load16(base + offsetof(Block, qh), qh);  // qh[0..7]: the 32 qh bytes
  }
  for (int c = 0; c < 2; ++c) {
    __m512i r[16];
    src.load16(base + offsetof(Block, qs) + 64 * size_t(c), r);
    // qs byte 64c + 4j + i: chunk h = 2c + j / 8, position l = 4 (j % 8) + i: its low nibble is
    // element 64h + l (group 16h + j % 8), its high nibble element 64h + 32 + l (8 groups on)
    for (int j = 0; j < 16; ++j) {
      const int g = 16 * (2 * c + j / 8) + j % 8;
      __m512i lo = _mm512_and_si512(r[j], m4);
      __m512i hi = _mm512_and_si512(_mm512_srli_epi32(r[j], 4), m4);
      if constexpr (kFifthBit) {
        // fifth bit of element e: bit e / 32 of qh[e % 32]; moved to bit 4 of the byte
        for (int half = 0; half < 2; ++half) {
          const int gg = g + 8 * half, s = gg / 8;
          const __m512i h = qh[gg % 8];
          const __m512i moved = s <= 4 ? _mm512_slli_epi32(h, unsigned(4 - s)) : _mm512_srli_epi32(h, unsigned(s - 4));
          __m512i& q = half ? hi : lo;
          q = _mm512_or_si512(q, _mm512_and_si512(moved, _mm512_set1_epi8(0x10)));
        }
      }
      tile.q[g] = lo;
      tile.q[g + 8] = hi;
    }
  }
  unpack_q45K_scales<Block>(src, sb, tile);
}

// Per token and super-block the Q8_K pair sums p_s = bsums[2s] + bsums[2s + 1] as the int16
// pairs of TileQ45K::mins: (p0, p2), (p1, p3), (p4, p6), (p5, p7). |p_s| <= 32 * 128.
void bsum_pairs(const uint8_t* a, size_t a_stride, int64_t n_tok, int64_t nsb, std::vector<int32_t>& out) {
  out.resize(size_t(n_tok * nsb) * 4);
  int32_t* o = out.data();
  for (int64_t t = 0; t < n_tok; ++t) {
    const auto* blocks = reinterpret_cast<const block_q8_K*>(a + size_t(t) * a_stride);
    for (int64_t sb = 0; sb < nsb; ++sb, o += 4) {
      const __m128i b = load16(blocks[sb].bsums);  // bsums 0..7 (sub-blocks 0..3)
      const __m128i c = load16(blocks[sb].bsums + 8);
      // pair sums as int32 lanes, then packed to int16: [p0 p1 p2 p3 p4 p5 p6 p7]
      const __m128i p = _mm_packs_epi32(_mm_madd_epi16(b, _mm_set1_epi16(1)), _mm_madd_epi16(c, _mm_set1_epi16(1)));
      // -> [p0 p2 p1 p3 p4 p6 p5 p7]
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o), _mm_shuffle_epi8(p, _mm_setr_epi8(0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15)));
    }
  }
}

// A super-block's integer sums of T tokens (sumi) to floats, added to out: the mins term from the
// pair sums (p: token 0's, pairs_stride apart), then da * (d * sumi - dmin * mins).
template <int T>
inline void q45K_finish(const ScalesQ45K& tile, const __m512i sumi[T], const uint8_t* const at[T], const int32_t* p,
                        size_t pairs_stride, __m512 out[T]) {
  for (int t = 0; t < T; ++t) {
    const int32_t* pt = p + size_t(t) * pairs_stride;
    __m512i mins = _mm512_setzero_si512();
    for (int k = 0; k < 4; ++k) mins = _mm512_dpwssd_epi32(mins, tile.mins[k], _mm512_set1_epi32(pt[k]));
    const __m512 v = _mm512_fmsub_ps(_mm512_cvtepi32_ps(sumi[t]), tile.d,
                                     _mm512_mul_ps(_mm512_cvtepi32_ps(mins), tile.dmin));
    float da;
    std::memcpy(&da, at[t] + offsetof(block_q8_K, d), 4);
    out[t] = _mm512_fmadd_ps(v, _mm512_set1_ps(da), out[t]);
  }
}

// Tokens t0 .. t0 + T against a panel of np super-blocks (tiles[0 .. np)): a and pairs at the
// panel's first super-block of token t0; the sums stay in registers over the panel, and y gets
// them once (stored, or added after the first panel).
template <int T>
void q45K_tokens(const TileQ45K* tiles, int64_t np, const uint8_t* a, size_t a_stride, const int32_t* pairs,
                 size_t pairs_stride, float* y, int64_t ldy, __mmask16 mask, bool first, StreamPrefetch& pf) {
  __m512 out[T];
  for (int t = 0; t < T; ++t) out[t] = _mm512_setzero_ps();
  for (int64_t i = 0; i < np; ++i) {
    const TileQ45K& tile = tiles[i];
    const uint8_t* at[T];
    for (int t = 0; t < T; ++t) at[t] = a + size_t(t) * a_stride + size_t(i) * sizeof(block_q8_K);
    __m512i sumi[T];
    for (int t = 0; t < T; ++t) sumi[t] = _mm512_setzero_si512();
    scaled_subblocks<T, 8, 8>(tile.q, tile.sc, at, sumi, pf);
    q45K_finish<T>(tile, sumi, at, pairs + 4 * size_t(i), pairs_stride, out);
  }
  for (int t = 0; t < T; ++t) store_rows(y + t * ldy, mask, out[t], first);
}

// The same on interleaved Q4_K with no unpacked tile: the quants come straight from the group's
// packed dwords (qs: super-block i's first, at qs + i * kQ4KGroupBytes), each register's low
// nibbles for sub-block 2h and its high nibbles, loaded again, for 2h + 1 (cpu/repack.h; see
// gemv_q4K_interleaved). Only the scales are unpacked (tiles). A routed expert of a 512-token
// prefill sees about 32 tokens, over which the unpacking to L1 and back cost about a tenth of
// its time; here each block of T tokens pays an AND (and a shift) per 8 T vpdpbusd instead.
constexpr size_t kQ4KGroupBytes = kRows * sizeof(block_q4_K);
template <int T>
void q4K_packed_tokens(const uint8_t* qs, const ScalesQ45K* tiles, int64_t np, const uint8_t* a, size_t a_stride,
                       const int32_t* pairs, size_t pairs_stride, float* y, int64_t ldy, bool first,
                       StreamPrefetch& pf) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  __m512 out[T];
  for (int t = 0; t < T; ++t) out[t] = _mm512_setzero_ps();
  for (int64_t i = 0; i < np; ++i) {
    const uint8_t* blk = qs + size_t(i) * kQ4KGroupBytes;
    const uint8_t* at[T];
    for (int t = 0; t < T; ++t) at[t] = a + size_t(t) * a_stride + size_t(i) * sizeof(block_q8_K);
    __m512i sumi[T];
    for (int t = 0; t < T; ++t) sumi[t] = _mm512_setzero_si512();
    for (int s = 0; s < 8; ++s) {
      const int h = s / 2;
      pf.step();
      pf.step();
      __m512i acc[T];
      for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_si512();
      for (int m = 0; m < 8; ++m) {
        const __m512i q = load64(blk + 64 * (8 * h + m));
        const __m512i w = _mm512_and_si512(s % 2 ? _mm512_srli_epi16(q, 4) : q, m4);
        for (int t = 0; t < T; ++t)
          acc[t] = _mm512_dpbusd_epi32(acc[t], w, bcast4(at[t] + kQ8KQs + 32 * s + 4 * m));
      }
      for (int t = 0; t < T; ++t) sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(acc[t], tiles[i].sc[s]));
    }
    q45K_finish<T>(tiles[i], sumi, at, pairs + 4 * size_t(i), pairs_stride, out);
  }
  for (int t = 0; t < T; ++t) store_rows(y + t * ldy, 0xFFFF, out[t], first);
}

// Two 16-row groups of interleaved Q4_K by T <= 4 tokens (group a's packed quants at qs, b's at
// qs + gstride): each broadcast activation feeds a vpdpbusd of each group, so a block runs one
// broadcast per two vpdpbusd where q4K_packed_tokens runs one per vpdpbusd (and splits each
// weight register's nibbles for 4 tokens instead of 8). The tile kernel alone (BM_tile q4_K, one
// thread, in L2): 0.66 -> 0.70 of the int8 probe at 32 and 128 tokens.
struct ScalesPair {
  ScalesQ45K g[2];
};
template <int T>
void q4K_pair_tokens(const uint8_t* qs, size_t gstride, const ScalesPair* tiles, int64_t np, const uint8_t* a,
                     size_t a_stride, const int32_t* pairs, size_t pairs_stride, float* y, int64_t ldy, bool first,
                     StreamPrefetch& pf) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  __m512 out[2][T];
  for (int t = 0; t < T; ++t) out[0][t] = out[1][t] = _mm512_setzero_ps();
  for (int64_t i = 0; i < np; ++i) {
    const uint8_t* blk = qs + size_t(i) * kQ4KGroupBytes;
    const uint8_t* at[T];
    for (int t = 0; t < T; ++t) at[t] = a + size_t(t) * a_stride + size_t(i) * sizeof(block_q8_K);
    __m512i sumi[2][T];
    for (int t = 0; t < T; ++t) sumi[0][t] = sumi[1][t] = _mm512_setzero_si512();
    for (int s = 0; s < 8; ++s) {
      const int h = s / 2;
      pf.step();
      pf.step();
      __m512i acc[2][T];
      for (int t = 0; t < T; ++t) acc[0][t] = acc[1][t] = _mm512_setzero_si512();
      for (int m = 0; m < 8; ++m) {
        const __m512i qa = load64(blk + 64 * (8 * h + m)), qb = load64(blk + gstride + 64 * (8 * h + m));
        const __m512i wa = _mm512_and_si512(s % 2 ? _mm512_srli_epi16(qa, 4) : qa, m4);
        const __m512i wb = _mm512_and_si512(s % 2 ? _mm512_srli_epi16(qb, 4) : qb, m4);
        for (int t = 0; t < T; ++t) {
          const __m512i x = bcast4(at[t] + kQ8KQs + 32 * s + 4 * m);
          acc[0][t] = _mm512_dpbusd_epi32(acc[0][t], wa, x);
          acc[1][t] = _mm512_dpbusd_epi32(acc[1][t], wb, x);
        }
      }
      for (int t = 0; t < T; ++t) {
        sumi[0][t] = _mm512_add_epi32(sumi[0][t], _mm512_mullo_epi32(acc[0][t], tiles[i].g[0].sc[s]));
        sumi[1][t] = _mm512_add_epi32(sumi[1][t], _mm512_mullo_epi32(acc[1][t], tiles[i].g[1].sc[s]));
      }
    }
    q45K_finish<T>(tiles[i].g[0], sumi[0], at, pairs + 4 * size_t(i), pairs_stride, out[0]);
    q45K_finish<T>(tiles[i].g[1], sumi[1], at, pairs + 4 * size_t(i), pairs_stride, out[1]);
  }
  for (int t = 0; t < T; ++t) {
    store_rows(y + t * ldy, 0xFFFF, out[0][t], first);
    store_rows(y + t * ldy + kRows, 0xFFFF, out[1][t], first);
  }
}

// A pair of interleaved Q4_K groups (rows a, then b) against n_tok tokens, in panels of 8
// super-blocks (2048 elements) and blocks of up to 4 tokens (as even as they can be); y rows
// r .. r + 32. Meanwhile the next panel of both groups, after the last the next pair's first, is
// prefetched into L2.
template <class Block, class Rows>
void q4K_pair(int64_t nsb, const Rows& a_rows, const Rows& b_rows, const uint8_t* ab, size_t a_stride,
              const int32_t* pairs, int64_t n_tok, float* y, int64_t ldy) {
  const size_t gstride = size_t(b_rows.group - a_rows.group);
  const uint8_t* qs = a_rows.group + offsetof(block_q4_K, qs) * kRows;
  constexpr int64_t kPanel = 8;
  group_panels<ScalesPair, kPanel, 4>(
      nsb, n_tok, pair_panels(a_rows.group, gstride, kQ4KGroupBytes, nsb, kPanel),
      [&](int64_t sb, ScalesPair& tile) {
        unpack_q45K_scales<Block>(a_rows, sb, tile.g[0]);
        unpack_q45K_scales<Block>(b_rows, sb, tile.g[1]);
      },
      [&](auto T, int64_t t0, const ScalesPair* tiles, int64_t sb0, int64_t np, StreamPrefetch& pf) {
        q4K_pair_tokens<decltype(T)::value>(qs + size_t(sb0) * kQ4KGroupBytes, gstride, tiles, np,
                                            ab + size_t(t0) * a_stride + size_t(sb0) * sizeof(block_q8_K), a_stride,
                                            pairs + size_t(t0 * nsb + sb0) * 4, size_t(nsb) * 4, y + t0 * ldy, ldy,
                                            sb0 == 0, pf);
      });
}

// Software prefetch distance of the decode kernels: two Q4_K super-blocks of a group ahead. The
// hardware prefetchers alone left one thread at 14 GB/s from DRAM (vec_dot on the file layout:
// 21); with this, 29 (measured on the 2-core Zen 4 VM, 4096 x 4096 matrices, in turn from a
// 256 MiB stack). The lines are asked for into L2 (prefetcht1), a few with each step of the
// kernel's loop (gemv_q4K_interleaved: one burst a super-block): asked for into L1 in one burst
// per super-block, the burst held the loop's own loads behind it. Zen 4, alternated with the
// burst (session 42, `strata_bench_kernels --benchmark_filter='BM_matmul_backend/q[46]_K/'`), of
// the DRAM probe: Q6_K one token 0.36-0.44 -> 0.69-0.86, four tokens 0.23-0.28 -> 0.51-0.73; Q4_K
// four tokens 0.35-0.45 -> 0.50-0.77. Not re-measured on Zen 5, where a driver of session 30 found four
// prefetches into L1 a loop step 5-10% slower than the burst paced over an unrolled loop.
constexpr size_t kPrefetchAhead = 2 * kRows * sizeof(block_q4_K);
// Q6_K's: two of its super-blocks (one and a third, as Q4_K's bytes: BM_expert_ffn/q6_K 0.70-0.72
// of the probe, two 0.76-0.80, three 0.72-0.82)
constexpr size_t kPrefetchAheadQ6 = 2 * kRows * sizeof(block_q6_K);
inline void prefetch_l2(const char* p) { _mm_prefetch(p, _MM_HINT_T1); }

// Decode (one token) on interleaved Q4_K: straight from the weights to the 16 rows' sums, with
// no tile in between. Register j of a group's super-block is dword j of each of its 16 rows
// (cpu/repack.h): dword 0 = d | dmin << 16, 1..3 = the packed scales, 4 + 8h + m = qs bytes
// 32h + 4m .. + 4, whose low nibbles are elements 4m .. 4m + 3 of sub-block 2h and whose high
// nibbles the same of sub-block 2h + 1. Eight int32 accumulators (one per sub-block) keep eight
// vpdpbusd chains independent.
void gemv_q4K_interleaved(int64_t nsb, const uint8_t* group, const uint8_t* a, const int32_t* pairs,
                          float* y) {
  const __m512i m4 = _mm512_set1_epi8(0x0F), m63 = _mm512_set1_epi8(63), m30 = _mm512_set1_epi8(0x30);
  const __m512i byte0 = _mm512_set1_epi32(0xFF), words = _mm512_set1_epi32(0x00FF00FF);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* blk = group + size_t(sb) * sizeof(block_q4_K) * kRows;
    const uint8_t* aq = a + size_t(sb) * sizeof(block_q8_K) + kQ8KQs;
    {
      // in one burst into L2: into L1 (session 42's choice) the burst took the L1's miss slots
      // from the loop's own loads, and the kernel fell behind the probe when it read fast (Zen 4,
      // session 46, 5 alternated rounds of BM_matmul_backend/q4_K/4096x4096 and
      // BM_expert_ffn/q4_K/16_layers: 0.82-0.95 and 0.73-0.91 of the probe into L1, 1.00-1.20 and
      // 0.93-0.99 into L2; 3 and 4 super-blocks ahead, or 6 and 8, no better). Spread into L2 as
      // the other decode kernels' (below): level with this burst (70.4 against 71.2 ms a token of
      // the synthetic 30B, token-interleaved A/B, session 46).
      const char* pf = reinterpret_cast<const char*>(blk) + kPrefetchAhead;
      for (int l = 0; l < 36; ++l) prefetch_l2(pf + 64 * l);
    }
    const __m512i z0 = load64(blk), z1 = load64(blk + 64), z2 = load64(blk + 128), z3 = load64(blk + 192);
    __m512i s[8];
    for (int k = 0; k < 8; ++k) s[k] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int h = 0; h < 4; ++h) {
#pragma GCC unroll 8
      for (int m = 0; m < 8; ++m) {
        const __m512i q = load64(blk + 64 * (4 + 8 * h + m));
        s[2 * h] = _mm512_dpbusd_epi32(s[2 * h], _mm512_and_si512(q, m4), bcast4(aq + 64 * h + 4 * m));
        s[2 * h + 1] = _mm512_dpbusd_epi32(s[2 * h + 1], _mm512_and_si512(_mm512_srli_epi16(q, 4), m4),
                                           bcast4(aq + 64 * h + 32 + 4 * m));
      }
    }
    const __m512i sc_lo = _mm512_and_si512(z1, m63);  // bytes sc0 .. sc3 of each row
    const __m512i sc_hi = _mm512_ternarylogic_epi32(_mm512_and_si512(z3, m4), _mm512_srli_epi32(z1, 2), m30, 0xF8);
    const __m512i mn_lo = _mm512_and_si512(z2, m63);
    const __m512i mn_hi = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi32(z3, 4), m4),
                                                    _mm512_srli_epi32(z2, 2), m30, 0xF8);
    __m512i sumi = _mm512_mullo_epi32(s[0], _mm512_and_si512(sc_lo, byte0));
    sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(s[1], _mm512_and_si512(_mm512_srli_epi32(sc_lo, 8), byte0)));
    sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(s[2], _mm512_and_si512(_mm512_srli_epi32(sc_lo, 16), byte0)));
    sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(s[3], _mm512_srli_epi32(sc_lo, 24)));
    sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(s[4], _mm512_and_si512(sc_hi, byte0)));
    sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(s[5], _mm512_and_si512(_mm512_srli_epi32(sc_hi, 8), byte0)));
    sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(s[6], _mm512_and_si512(_mm512_srli_epi32(sc_hi, 16), byte0)));
    sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(s[7], _mm512_srli_epi32(sc_hi, 24)));
    // sum_s m_s p_s as int16 pairs (m0, m2) . (p0, p2) + ...: bsum_pairs' order
    const int32_t* p = pairs + 4 * sb;
    __m512i mins = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_and_si512(mn_lo, words), _mm512_set1_epi32(p[0]));
    mins = _mm512_dpwssd_epi32(mins, _mm512_and_si512(_mm512_srli_epi32(mn_lo, 8), words), _mm512_set1_epi32(p[1]));
    mins = _mm512_dpwssd_epi32(mins, _mm512_and_si512(mn_hi, words), _mm512_set1_epi32(p[2]));
    mins = _mm512_dpwssd_epi32(mins, _mm512_and_si512(_mm512_srli_epi32(mn_hi, 8), words), _mm512_set1_epi32(p[3]));
    const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(z0));
    const __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(z0, 16)));
    const __m512 v = _mm512_fmsub_ps(_mm512_cvtepi32_ps(sumi), d, _mm512_mul_ps(_mm512_cvtepi32_ps(mins), dmin));
    float da;
    std::memcpy(&da, a + size_t(sb) * sizeof(block_q8_K) + offsetof(block_q8_K, d), 4);
    acc = _mm512_fmadd_ps(v, _mm512_set1_ps(da), acc);
  }
  _mm512_storeu_ps(y, acc);
}

// A few tokens (speculative verification, small batches) on interleaved Q4_K: the decode kernel's
// loads and nibble splits shared by T tokens, each with its own sums; the scales are applied per
// pair of sub-blocks so that 3 T accumulators are live (in registers up to T = 4; up to 8, the
// spills cost less than a second pass that decodes the weights again: 5 tokens in 274-288 us
// against 284-328 us as 4 + 1, 4096 x 4096). The panel path unpacks tiles to memory first, which
// cost as much as a second pass over the weights at 2-8 tokens.
template <int T>
void gemv_q4K_interleaved_tokens(int64_t nsb, const uint8_t* group, const uint8_t* a, size_t a_stride,
                                 const int32_t* pairs, size_t pairs_stride, float* y, int64_t ldy) {
  const __m512i m4 = _mm512_set1_epi8(0x0F), m63 = _mm512_set1_epi8(63), m30 = _mm512_set1_epi8(0x30);
  const __m512i byte0 = _mm512_set1_epi32(0xFF), words = _mm512_set1_epi32(0x00FF00FF);
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* blk = group + size_t(sb) * sizeof(block_q4_K) * kRows;
    // the 36 lines kPrefetchAhead on: the 4 of the scales here, one with each quant register
    const char* pf = reinterpret_cast<const char*>(blk) + kPrefetchAhead;
    for (int l = 0; l < 4; ++l) prefetch_l2(pf + 64 * l);
    const __m512i z0 = load64(blk), z1 = load64(blk + 64), z2 = load64(blk + 128), z3 = load64(blk + 192);
    const __m512i sc_lo = _mm512_and_si512(z1, m63);  // bytes sc0 .. sc3 of each row
    const __m512i sc_hi = _mm512_ternarylogic_epi32(_mm512_and_si512(z3, m4), _mm512_srli_epi32(z1, 2), m30, 0xF8);
    const uint8_t* aq[T];
    for (int t = 0; t < T; ++t) aq[t] = a + size_t(t) * a_stride + size_t(sb) * sizeof(block_q8_K) + kQ8KQs;
    __m512i sumi[T];
    for (int t = 0; t < T; ++t) sumi[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int h = 0; h < 4; ++h) {
      __m512i lo_acc[T], hi_acc[T];
      for (int t = 0; t < T; ++t) lo_acc[t] = hi_acc[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int m = 0; m < 8; ++m) {
        const __m512i q = load64(blk + 64 * (4 + 8 * h + m));
        prefetch_l2(pf + 64 * (4 + 8 * h + m));
        const __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
        for (int t = 0; t < T; ++t) {
          lo_acc[t] = _mm512_dpbusd_epi32(lo_acc[t], lo, bcast4(aq[t] + 64 * h + 4 * m));
          hi_acc[t] = _mm512_dpbusd_epi32(hi_acc[t], hi, bcast4(aq[t] + 64 * h + 32 + 4 * m));
        }
      }
      // the scales of sub-blocks 2h and 2h + 1: bytes 2h % 4 and 2h % 4 + 1 of sc_lo (h < 2) or sc_hi
      const __m512i src = h < 2 ? sc_lo : sc_hi;
      const unsigned shift = 16 * unsigned(h % 2);
      const __m512i sc_a = _mm512_and_si512(_mm512_srli_epi32(src, shift), byte0);
      const __m512i sc_b = _mm512_and_si512(_mm512_srli_epi32(src, shift + 8), byte0);
      for (int t = 0; t < T; ++t)
        sumi[t] = _mm512_add_epi32(sumi[t], _mm512_add_epi32(_mm512_mullo_epi32(lo_acc[t], sc_a),
                                                             _mm512_mullo_epi32(hi_acc[t], sc_b)));
    }
    const __m512i mn_lo = _mm512_and_si512(z2, m63);
    const __m512i mn_hi = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi32(z3, 4), m4),
                                                    _mm512_srli_epi32(z2, 2), m30, 0xF8);
    const __m512i mn[4] = {_mm512_and_si512(mn_lo, words), _mm512_and_si512(_mm512_srli_epi32(mn_lo, 8), words),
                           _mm512_and_si512(mn_hi, words), _mm512_and_si512(_mm512_srli_epi32(mn_hi, 8), words)};
    const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(z0));
    const __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(z0, 16)));
    for (int t = 0; t < T; ++t) {
      const int32_t* p = pairs + size_t(t) * pairs_stride + 4 * size_t(sb);
      __m512i mins = _mm512_setzero_si512();
      for (int k = 0; k < 4; ++k) mins = _mm512_dpwssd_epi32(mins, mn[k], _mm512_set1_epi32(p[k]));
      const __m512 v = _mm512_fmsub_ps(_mm512_cvtepi32_ps(sumi[t]), d, _mm512_mul_ps(_mm512_cvtepi32_ps(mins), dmin));
      float da;
      std::memcpy(&da, aq[t] - kQ8KQs + offsetof(block_q8_K, d), 4);
      acc[t] = _mm512_fmadd_ps(v, _mm512_set1_ps(da), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) _mm512_storeu_ps(y + t * ldy, acc[t]);
}

// Up to this many tokens (a speculative verification step), every kernel computes each token
// exactly as it computes one token alone, so that a batch's results are bit-identical to one-token
// decoding: interleaved Q4_K and Q6_K take the fused kernels (blocks of 8 and 6 tokens, integer
// sums exact), the 32-element formats their decode kernel per token, floats blocks of 2 tokens.
// Above it, the panels.
constexpr int64_t kFusedMaxTokens = kBatchInvariantTokens;
// Tokens one pass of the fused kernels serves (more are served in further passes over the same
// rows, from cache, each decoding the weights again).
constexpr int64_t kQ4KFusedTokens = 8, kQ6KFusedTokens = 6;

// Tiles of Q4_K / Q5_K over 16 rows at a time from `Rows` (FileRows, or Interleaved: w the start
// of a group, n_rows a multiple of 16). One token on interleaved Q4_K goes to the fused decode
// kernel, a few to its several-token form, more to q4K_packed_tokens over panels of unpacked
// scales; otherwise panels of super-blocks are unpacked and shared by blocks of up to 8 tokens.
template <class Block, bool kFifthBit, class Rows>
void gemm_q45K(int64_t n, const void* w, size_t w_stride, int64_t n_rows, const void* a, size_t a_stride,
               int64_t n_tok, float* y, int64_t ldy) {
  const int64_t nsb = n / QK_K;
  const auto* ab = static_cast<const uint8_t*>(a);
  thread_local std::vector<int32_t> pairs;
  bsum_pairs(ab, a_stride, n_tok, nsb, pairs);
  for (int64_t r0 = 0; r0 < n_rows; r0 += kRows) {
    const Rows rows(w, w_stride, r0, n_rows);
    if constexpr (std::is_same_v<Rows, Interleaved> && !kFifthBit) {
      if (n_tok == 1) {
        gemv_q4K_interleaved(nsb, rows.group, ab, pairs.data(), y + r0);
        continue;
      }
      if (n_tok <= kFusedMaxTokens) {
        for (int64_t t0 = 0; t0 < n_tok; t0 += kQ4KFusedTokens) {
          const uint8_t* at = ab + size_t(t0) * a_stride;
          const int32_t* pt = pairs.data() + size_t(t0 * nsb) * 4;
          float* yt = y + t0 * ldy + r0;
          switch (std::min<int64_t>(kQ4KFusedTokens, n_tok - t0)) {
            case 8: gemv_q4K_interleaved_tokens<8>(nsb, rows.group, at, a_stride, pt, size_t(nsb) * 4, yt, ldy); break;
            case 7: gemv_q4K_interleaved_tokens<7>(nsb, rows.group, at, a_stride, pt, size_t(nsb) * 4, yt, ldy); break;
            case 6: gemv_q4K_interleaved_tokens<6>(nsb, rows.group, at, a_stride, pt, size_t(nsb) * 4, yt, ldy); break;
            case 5: gemv_q4K_interleaved_tokens<5>(nsb, rows.group, at, a_stride, pt, size_t(nsb) * 4, yt, ldy); break;
            case 4: gemv_q4K_interleaved_tokens<4>(nsb, rows.group, at, a_stride, pt, size_t(nsb) * 4, yt, ldy); break;
            case 3: gemv_q4K_interleaved_tokens<3>(nsb, rows.group, at, a_stride, pt, size_t(nsb) * 4, yt, ldy); break;
            case 2: gemv_q4K_interleaved_tokens<2>(nsb, rows.group, at, a_stride, pt, size_t(nsb) * 4, yt, ldy); break;
            default: gemv_q4K_interleaved(nsb, rows.group, at, pt, yt); break;
          }
        }
        continue;
      }
    }
    if constexpr (std::is_same_v<Rows, Interleaved> && !kFifthBit) {
      // two groups at a time while two whole groups are left
      if (r0 + 2 * kRows <= n_rows) {
        q4K_pair<Block>(nsb, rows, Rows(w, w_stride, r0 + kRows, n_rows), ab, a_stride, pairs.data(), n_tok, y + r0,
                        ldy);
        r0 += kRows;  // the pair's second group
        continue;
      }
    }
    if constexpr (std::is_same_v<Rows, Interleaved> && !kFifthBit) {
      // panels of the same 2048 elements as the unpacked tiles' (the group's weights and T
      // tokens' activations in L1)
      constexpr int64_t kPanel = kPanelBytes / sizeof(TileQ45K);
      group_panels<ScalesQ45K, kPanel>(
          nsb, n_tok, stream_panels(rows.stream(), kQ4KGroupBytes, nsb, kPanel),
          [&](int64_t sb, ScalesQ45K& tile) { unpack_q45K_scales<Block>(rows, sb, tile); },
          [&](auto T, int64_t t0, const ScalesQ45K* tiles, int64_t sb0, int64_t np, StreamPrefetch& pf) {
            q4K_packed_tokens<decltype(T)::value>(
                rows.group + size_t(sb0) * kQ4KGroupBytes + offsetof(block_q4_K, qs) * kRows, tiles, np,
                ab + size_t(t0) * a_stride + size_t(sb0) * sizeof(block_q8_K), a_stride,
                pairs.data() + size_t(t0 * nsb + sb0) * 4, size_t(nsb) * 4, y + t0 * ldy + r0, ldy, sb0 == 0, pf);
          });
      continue;
    }
    group_panels<TileQ45K>(
        nsb, n_tok, stream_panels(rows.stream(), kRows * sizeof(Block), nsb, kPanelBytes / sizeof(TileQ45K)),
        [&](int64_t sb, TileQ45K& tile) { unpack_q45K<Block, kFifthBit>(rows, sb, tile); },
        [&](auto T, int64_t t0, const TileQ45K* tiles, int64_t sb0, int64_t np, StreamPrefetch& pf) {
          q45K_tokens<decltype(T)::value>(tiles, np, ab + size_t(t0) * a_stride + size_t(sb0) * sizeof(block_q8_K),
                                          a_stride, pairs.data() + size_t(t0 * nsb + sb0) * 4, size_t(nsb) * 4,
                                          y + t0 * ldy + r0, ldy, rows.mask, sb0 == 0, pf);
        });
  }
}

// ---- Q6_K ----

struct TileQ6K {
  __m512i q[64];   // group g: lane r = stored quants (q + 32, 0..63) 4g .. 4g + 3 of row r
  __m512i sc[16];  // sub-block scales, int32 per row
  __m512 d;
};

// The stored quants are q + 32: per token and super-block, -32 times the Q8_K sub-block sums
// (bsums) as int32, where each sub-block's vpdpbusd sums start (a broadcast load each, in place
// of the offset term's eight vpdpwssd a token and super-block, which take vpdpbusd's ports).
// Laid out as the activations, a_stride per token and 64 bytes per super-block, so that token t's
// offsets of super-block sb lie a fixed distance from its Q8_K block: at
// at[t] + offsets_delta(out, a, sb) (int8 *: bytes).
void q6K_offsets(const uint8_t* a, size_t a_stride, int64_t n_tok, int64_t nsb, std::vector<uint8_t>& out) {
  out.resize(size_t(n_tok) * a_stride);
  for (int64_t t = 0; t < n_tok; ++t) {
    const auto* blocks = reinterpret_cast<const block_q8_K*>(a + size_t(t) * a_stride);
    uint8_t* o = out.data() + size_t(t) * a_stride;
    for (int64_t sb = 0; sb < nsb; ++sb)
      _mm512_storeu_si512(o + 64 * sb, _mm512_slli_epi32(_mm512_sub_epi32(_mm512_setzero_si512(),
                                                                          _mm512_cvtepi16_epi32(load32(blocks[sb].bsums))),
                                                         5));
  }
}
// from super-block sb's Q8_K block of a token (activations at a) to its offsets (out), in integers
// (the two buffers are different objects: at_offset)
inline ptrdiff_t offsets_delta(const std::vector<uint8_t>& out, const uint8_t* a, int64_t sb) {
  return ptrdiff_t(reinterpret_cast<uintptr_t>(out.data()) - reinterpret_cast<uintptr_t>(a)) +
         sb * (64 - ptrdiff_t(sizeof(block_q8_K)));
}

// Where a Q6_K tile's 16 rows come from (d(sb): the rows' scales of super-block sb). Q6FileRows
// transposes the file layout (load16(sb, off, r): r[j] lane i = dword off / 4 + j of super-block
// sb of row i, as FileRows for Q4_K); Q6Interleaved reads cpu/repack.h's layout (units of two
// super-blocks: their 52 dwords each, then the 16 rows' d of each), a register per dword.
struct Q6FileRows {
  RowTile rt;
  __mmask16 mask;
  Q6FileRows(const void* w, size_t w_stride, int64_t r0, int64_t n_rows, int64_t /*nsb*/)
      : rt(row_tile(w, w_stride, r0, n_rows)), mask(rt.mask) {}
  void load16(int64_t sb, size_t off, __m512i r[16]) const {
    load_transposed(rt.rows, size_t(sb) * sizeof(block_q6_K) + off, r);
  }
  void load4(int64_t sb, size_t off, __m512i z[4]) const {
    load_transposed_16x4(rt.rows, size_t(sb) * sizeof(block_q6_K) + off, z);
  }
  __m512 d(int64_t sb) const {
    alignas(32) uint16_t dh[kRows];
    for (int i = 0; i < kRows; ++i)
      std::memcpy(&dh[i], rt.rows[i] + size_t(sb) * sizeof(block_q6_K) + offsetof(block_q6_K, d), 2);
    return _mm512_cvtph_ps(load32(dh));
  }
  const uint8_t* stream() const { return nullptr; }
};
struct Q6Interleaved {
  static constexpr size_t kDwords = offsetof(block_q6_K, d) / 4;  // 52: ql, qh, scales
  const uint8_t* group;
  int64_t nsb;
  __mmask16 mask = 0xFFFF;
  Q6Interleaved(const void* w, size_t w_stride, int64_t r0, int64_t /*n_rows: whole groups*/, int64_t nsb_)
      : group(static_cast<const uint8_t*>(w) + size_t(r0) * w_stride), nsb(nsb_) {}
  // super-block sb's dwords (register k at + 64 k)
  const uint8_t* dwords(int64_t sb) const {
    const int64_t ub = sb & ~int64_t(1);
    return group + size_t(ub) * sizeof(block_q6_K) * kRows + size_t(sb - ub) * kDwords * 64;
  }
  __m512 d(int64_t sb) const {
    const int64_t ub = sb & ~int64_t(1), m = std::min<int64_t>(2, nsb - ub);
    const uint8_t* tails = group + size_t(ub) * sizeof(block_q6_K) * kRows + size_t(m) * kDwords * 64;
    return _mm512_cvtph_ps(load32(tails + size_t(sb - ub) * kRows * 2));
  }
  const uint8_t* stream() const { return group; }
};

template <class Src>
void unpack_q6K(const Src& src, int64_t sb, TileQ6K& tile) {
  const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
  if constexpr (std::is_same_v<Src, Q6Interleaved>) {
    // straight from the loads, as gemv_q6K_interleaved (whose comment has the layout): register
    // 32n + 8k + m of the tile from ql dwords 16n + m, 16n + 8 + m and qh dword 32 + 8n + m.
    // Through arrays of the 16-register loads (below) GCC stored every load to the stack first,
    // and the stores made the unpacking a third of the Q6_K experts' time in pp512.
    const uint8_t* dw = src.dwords(sb);
    for (int n = 0; n < 2; ++n)
      for (int m = 0; m < 8; ++m) {
        const __m512i qa = load64(dw + 64 * (16 * n + m)), qb = load64(dw + 64 * (16 * n + 8 + m));
        const __m512i h = load64(dw + 64 * (32 + 8 * n + m));
        __m512i* q = tile.q + 32 * n + m;
        q[0] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_slli_epi16(h, 4), m30), m4, qa, 0xB8);
        q[8] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_slli_epi16(h, 2), m30), m4, qb, 0xB8);
        q[16] = _mm512_ternarylogic_epi32(_mm512_and_si512(h, m30), m4, _mm512_srli_epi16(qa, 4), 0xB8);
        q[24] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(h, 2), m30), m4,
                                          _mm512_srli_epi16(qb, 4), 0xB8);
      }
    for (int k = 0; k < 4; ++k) {  // scale dword 48 + k: sc 4k .. 4k + 3
      const __m512i z = load64(dw + 64 * (48 + k));
      for (int i = 0; i < 4; ++i) tile.sc[4 * k + i] = _mm512_srai_epi32(_mm512_slli_epi32(z, 24 - 8 * i), 24);
    }
  } else {
    // the file layout, transposed 16 registers at a time
    __m512i qh[16];
    src.load16(sb, offsetof(block_q6_K, qh), qh);
    for (int h = 0; h < 2; ++h) {
      __m512i ql[16];
      src.load16(sb, offsetof(block_q6_K, ql) + 64 * size_t(h), ql);
      // element 128h + 32k + l (group 32h + 8k + m, l = 4m + i): low 4 bits in ql[64h + 32 (k % 2)
      // + l] (nibble k / 2), i.e. transposed dword 8 (k % 2) + m; high 2 bits at bit 2k of
      // qh[32h + l], transposed dword 8h + m
      for (int k = 0; k < 4; ++k) {
        for (int m = 0; m < 8; ++m) {
          const __m512i l = ql[8 * (k % 2) + m];
          const __m512i low = k < 2 ? _mm512_and_si512(l, m4) : _mm512_and_si512(_mm512_srli_epi32(l, 4), m4);
          const __m512i hb = qh[8 * h + m];
          __m512i high;
          switch (k) {
            case 0: high = _mm512_slli_epi32(hb, 4); break;
            case 1: high = _mm512_slli_epi32(hb, 2); break;
            case 2: high = hb; break;
            default: high = _mm512_srli_epi32(hb, 2); break;
          }
          tile.q[32 * h + 8 * k + m] = _mm512_or_si512(low, _mm512_and_si512(high, m30));
        }
      }
    }
    __m512i z[4];
    src.load4(sb, offsetof(block_q6_K, scales), z);  // z[k]: sc 4k .. 4k + 3
    for (int k = 0; k < 4; ++k)
      for (int i = 0; i < 4; ++i) tile.sc[4 * k + i] = _mm512_srai_epi32(_mm512_slli_epi32(z[k], 24 - 8 * i), 24);
  }
  tile.d = src.d(sb);
}

// Tokens t0 .. t0 + T against a panel of np super-blocks (as q45K_tokens); off: offsets_delta of
// the panel's first super-block.
template <int T>
void q6K_tokens(const TileQ6K* tiles, int64_t np, const uint8_t* a, size_t a_stride, ptrdiff_t off, float* y,
                int64_t ldy, __mmask16 mask, bool first, StreamPrefetch& pf) {
  __m512 out[T];
  for (int t = 0; t < T; ++t) out[t] = _mm512_setzero_ps();
  for (int64_t i = 0; i < np; ++i) {
    const TileQ6K& tile = tiles[i];
    const uint8_t* at[T];
    __m512i sumi[T];
    for (int t = 0; t < T; ++t) {
      at[t] = a + size_t(t) * a_stride + size_t(i) * sizeof(block_q8_K);
      sumi[t] = _mm512_setzero_si512();
    }
    scaled_subblocks<T, 16, 4, true>(tile.q, tile.sc, at, sumi, pf, off + i * (64 - ptrdiff_t(sizeof(block_q8_K))));
    for (int t = 0; t < T; ++t) {
      float da;
      std::memcpy(&da, at[t] + offsetof(block_q8_K, d), 4);
      out[t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sumi[t]), tile.d), _mm512_set1_ps(da), out[t]);
    }
  }
  for (int t = 0; t < T; ++t) store_rows(y + t * ldy, mask, out[t], first);
}

// Two 16-row groups of Q6_K tiles by T <= 4 tokens (as q4K_pair_tokens): each broadcast activation
// feeds a vpdpbusd (and the offset term's vpdpwssd) of each group.
struct TilePairQ6K {
  TileQ6K g[2];
};
constexpr int64_t kQ6KPairPanel = std::max<int64_t>(1, int64_t(kPanelBytes / sizeof(TilePairQ6K)));
template <int T>
void q6K_pair_tokens(const TilePairQ6K* tiles, int64_t np, const uint8_t* a, size_t a_stride, ptrdiff_t off,
                     float* y, int64_t ldy, bool first, StreamPrefetch& pf) {
  __m512 out[2][T];
  for (int t = 0; t < T; ++t) out[0][t] = out[1][t] = _mm512_setzero_ps();
  for (int64_t i = 0; i < np; ++i) {
    const TileQ6K& ta = tiles[i].g[0];
    const TileQ6K& tb = tiles[i].g[1];
    const uint8_t* at[T];
    __m512i sumi[2][T];
    for (int t = 0; t < T; ++t) {
      at[t] = a + size_t(t) * a_stride + size_t(i) * sizeof(block_q8_K);
      sumi[0][t] = sumi[1][t] = _mm512_setzero_si512();
    }
    const ptrdiff_t oi = off + i * (64 - ptrdiff_t(sizeof(block_q8_K)));
    for (int s = 0; s < 16; ++s) {
      pf.step();
      __m512i acc[2][T];
      for (int t = 0; t < T; ++t) acc[0][t] = acc[1][t] = bcast4(at_offset(at[t], oi + 4 * s));
      for (int g = 0; g < 4; ++g) {
        const __m512i wa = ta.q[4 * s + g], wb = tb.q[4 * s + g];
        for (int t = 0; t < T; ++t) {
          const __m512i x = bcast4(at[t] + kQ8KQs + 4 * (4 * s + g));
          acc[0][t] = _mm512_dpbusd_epi32(acc[0][t], wa, x);
          acc[1][t] = _mm512_dpbusd_epi32(acc[1][t], wb, x);
        }
      }
      for (int t = 0; t < T; ++t) {
        sumi[0][t] = _mm512_add_epi32(sumi[0][t], _mm512_mullo_epi32(acc[0][t], ta.sc[s]));
        sumi[1][t] = _mm512_add_epi32(sumi[1][t], _mm512_mullo_epi32(acc[1][t], tb.sc[s]));
      }
    }
    for (int t = 0; t < T; ++t) {
      float da;
      std::memcpy(&da, at[t] + offsetof(block_q8_K, d), 4);
      const __m512 dav = _mm512_set1_ps(da);
      out[0][t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sumi[0][t]), ta.d), dav, out[0][t]);
      out[1][t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sumi[1][t]), tb.d), dav, out[1][t]);
    }
  }
  for (int t = 0; t < T; ++t) {
    store_rows(y + t * ldy, 0xFFFF, out[0][t], first);
    store_rows(y + t * ldy + kRows, 0xFFFF, out[1][t], first);
  }
}

// Decode (one token) on interleaved Q6_K, straight from the loads: for half n of a super-block
// and m < 8, ql dwords 16n + m (a) and 16n + 8 + m (b) and qh dword 32 + 8n + m (h) give four
// registers of 6-bit quants (stored + 32): elements 128n + 32k + 4m .. + 3 for k = 0..3, i.e.
// sub-block 8n + 2k + m / 4; k = 0: a's low nibbles | h bits 0-1, 1: b's low | h 2-3, 2: a's
// high | h 4-5, 3: b's high | h 6-7. Each sub-block's accumulator starts at -32 bsums (the
// stored offset), then times its int8 scale.
void gemv_q6K_interleaved(const Q6Interleaved& src, const uint8_t* a, float* y) {
  const int64_t nsb = src.nsb;
  const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* dw = src.dwords(sb);
    // the super-block's 53 lines kPrefetchAheadQ6 on, 4 with each of the loop's 16 steps
    const char* pf =
        reinterpret_cast<const char*>(src.group + size_t(sb) * sizeof(block_q6_K) * kRows) + kPrefetchAheadQ6;
    const uint8_t* ab = a + size_t(sb) * sizeof(block_q8_K);
    const uint8_t* aq = ab + kQ8KQs;
    int16_t bsums[16];
    std::memcpy(bsums, ab + kQ8KBsums, sizeof bsums);
    __m512i sumi = _mm512_setzero_si512();
    for (int n = 0; n < 2; ++n) {
      __m512i s[8];
      for (int j = 0; j < 8; ++j) s[j] = _mm512_set1_epi32(-32 * int32_t(bsums[8 * n + j]));
#pragma GCC unroll 8
      for (int m = 0; m < 8; ++m) {
        const __m512i qa = load64(dw + 64 * (16 * n + m)), qb = load64(dw + 64 * (16 * n + 8 + m));
        const __m512i h = load64(dw + 64 * (32 + 8 * n + m));
        for (int l = 0; l < 4; ++l) prefetch_l2(pf + 256 * (8 * n + m) + 64 * l);
        const uint8_t* x = aq + 128 * n + 4 * m;
        const int j = m / 4;
        // (lo & 0x0F) | (hi & 0x30): vpternlog 0xB8 = mask ? lo : hi with (hi, mask 0x0F, lo), so
        // that the instruction overwrites the temporary hi, not a copy of the mask
        const __m512i q0 = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_slli_epi16(h, 4), m30), m4, qa, 0xB8);
        const __m512i q1 = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_slli_epi16(h, 2), m30), m4, qb, 0xB8);
        const __m512i q2 = _mm512_ternarylogic_epi32(_mm512_and_si512(h, m30), m4, _mm512_srli_epi16(qa, 4), 0xB8);
        const __m512i q3 = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(h, 2), m30), m4, _mm512_srli_epi16(qb, 4), 0xB8);
        s[j] = _mm512_dpbusd_epi32(s[j], q0, bcast4(x));
        s[2 + j] = _mm512_dpbusd_epi32(s[2 + j], q1, bcast4(x + 32));
        s[4 + j] = _mm512_dpbusd_epi32(s[4 + j], q2, bcast4(x + 64));
        s[6 + j] = _mm512_dpbusd_epi32(s[6 + j], q3, bcast4(x + 96));
      }
      // sub-block 8n + j's scale: byte (8n + j) % 4 of scale dword 48 + (8n + j) / 4, sign-extended
      const __m512i z0 = load64(dw + 64 * (48 + 2 * n)), z1 = load64(dw + 64 * (49 + 2 * n));
      for (int j = 0; j < 8; ++j) {
        const __m512i z = j < 4 ? z0 : z1;
        const __m512i sc = _mm512_srai_epi32(_mm512_slli_epi32(z, 24 - 8 * (j % 4)), 24);
        sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(s[j], sc));
      }
    }
    float da;
    std::memcpy(&da, ab + offsetof(block_q8_K, d), 4);
    acc = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sumi), src.d(sb)), _mm512_set1_ps(da), acc);
  }
  _mm512_storeu_ps(y, acc);
}

// A few tokens on interleaved Q6_K (as gemv_q4K_interleaved_tokens for Q4_K): the loads and the
// six-bit assembly shared by T tokens. Each half of a 128-element chunk touches four sub-blocks
// (8n + j, + 2, + 4, + 6 for half j), whose sums are scaled into the token's total after it, so
// 5 T accumulators are live (all in registers up to T = 3; up to 6 the spills cost less than
// decoding the weights again).
template <int T>
void gemv_q6K_interleaved_tokens(const Q6Interleaved& src, const uint8_t* a, size_t a_stride, float* y, int64_t ldy) {
  const int64_t nsb = src.nsb;
  const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* dw = src.dwords(sb);
    const char* pf =
        reinterpret_cast<const char*>(src.group + size_t(sb) * sizeof(block_q6_K) * kRows) + kPrefetchAheadQ6;
    const uint8_t* ab[T];
    for (int t = 0; t < T; ++t) ab[t] = a + size_t(t) * a_stride + size_t(sb) * sizeof(block_q8_K);
    __m512i sumi[T];
    int16_t bs[T][16];  // the tokens' sub-block sums
    for (int t = 0; t < T; ++t) {
      sumi[t] = _mm512_setzero_si512();
      std::memcpy(bs[t], ab[t] + kQ8KBsums, sizeof bs[t]);
    }
    for (int n = 0; n < 2; ++n) {
      const __m512i z0 = load64(dw + 64 * (48 + 2 * n)), z1 = load64(dw + 64 * (49 + 2 * n));
#pragma GCC unroll 2
      for (int j = 0; j < 2; ++j) {
        // s[t][i]: sub-block 8n + 2i + j of token t, started at -32 times its activation sum
        __m512i s[T][4];
        for (int t = 0; t < T; ++t)
          for (int i = 0; i < 4; ++i) s[t][i] = _mm512_set1_epi32(-32 * int32_t(bs[t][8 * n + 2 * i + j]));
#pragma GCC unroll 4
        for (int m = 4 * j; m < 4 * j + 4; ++m) {
          const __m512i qa = load64(dw + 64 * (16 * n + m)), qb = load64(dw + 64 * (16 * n + 8 + m));
          const __m512i h = load64(dw + 64 * (32 + 8 * n + m));
          for (int l = 0; l < 4; ++l) prefetch_l2(pf + 256 * (8 * n + m) + 64 * l);  // as gemv_q6K_interleaved
          const __m512i q0 = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_slli_epi16(h, 4), m30), m4, qa, 0xB8);
          const __m512i q1 = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_slli_epi16(h, 2), m30), m4, qb, 0xB8);
          const __m512i q2 = _mm512_ternarylogic_epi32(_mm512_and_si512(h, m30), m4, _mm512_srli_epi16(qa, 4), 0xB8);
          const __m512i q3 = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(h, 2), m30), m4,
                                                       _mm512_srli_epi16(qb, 4), 0xB8);
          for (int t = 0; t < T; ++t) {
            const uint8_t* x = ab[t] + kQ8KQs + 128 * n + 4 * m;
            s[t][0] = _mm512_dpbusd_epi32(s[t][0], q0, bcast4(x));
            s[t][1] = _mm512_dpbusd_epi32(s[t][1], q1, bcast4(x + 32));
            s[t][2] = _mm512_dpbusd_epi32(s[t][2], q2, bcast4(x + 64));
            s[t][3] = _mm512_dpbusd_epi32(s[t][3], q3, bcast4(x + 96));
          }
        }
        for (int i = 0; i < 4; ++i) {
          const int k = 2 * i + j;  // sub-block 8n + k: byte k % 4 of scale dword z0 (k < 4) or z1
          const __m512i sc = _mm512_srai_epi32(_mm512_slli_epi32(k < 4 ? z0 : z1, 24 - 8 * (k % 4)), 24);
          for (int t = 0; t < T; ++t) sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(s[t][i], sc));
        }
      }
    }
    const __m512 d = src.d(sb);
    for (int t = 0; t < T; ++t) {
      float da;
      std::memcpy(&da, ab[t] + offsetof(block_q8_K, d), 4);
      acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sumi[t]), d), _mm512_set1_ps(da), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) _mm512_storeu_ps(y + t * ldy, acc[t]);
}

// Tiles of Q6_K over 16 rows at a time from `Rows` (Q6FileRows, or Q6Interleaved: w the start of
// a group, n_rows a multiple of 16, and one token to the fused decode kernel above).
template <class Rows>
void gemm_q6K(int64_t n, const void* w, size_t w_stride, int64_t n_rows, const void* a, size_t a_stride,
              int64_t n_tok, float* y, int64_t ldy) {
  const int64_t nsb = n / QK_K;
  const auto* ab = static_cast<const uint8_t*>(a);
  thread_local std::vector<uint8_t> offs;  // the panels' (the fused kernels read bsums themselves)
  if (!std::is_same_v<Rows, Q6Interleaved> || n_tok > kFusedMaxTokens) q6K_offsets(ab, a_stride, n_tok, nsb, offs);
  for (int64_t r0 = 0; r0 < n_rows; r0 += kRows) {
    const Rows rows(w, w_stride, r0, n_rows, nsb);
    if constexpr (std::is_same_v<Rows, Q6Interleaved>) {
      if (n_tok == 1) {
        gemv_q6K_interleaved(rows, ab, y + r0);
        continue;
      }
      if (n_tok <= kFusedMaxTokens) {
        for (int64_t t0 = 0; t0 < n_tok; t0 += kQ6KFusedTokens) {
          const uint8_t* at = ab + size_t(t0) * a_stride;
          float* yt = y + t0 * ldy + r0;
          switch (std::min<int64_t>(kQ6KFusedTokens, n_tok - t0)) {
            case 6: gemv_q6K_interleaved_tokens<6>(rows, at, a_stride, yt, ldy); break;
            case 5: gemv_q6K_interleaved_tokens<5>(rows, at, a_stride, yt, ldy); break;
            case 4: gemv_q6K_interleaved_tokens<4>(rows, at, a_stride, yt, ldy); break;
            case 3: gemv_q6K_interleaved_tokens<3>(rows, at, a_stride, yt, ldy); break;
            case 2: gemv_q6K_interleaved_tokens<2>(rows, at, a_stride, yt, ldy); break;
            default: gemv_q6K_interleaved(rows, at, yt); break;
          }
        }
        continue;
      }
    }
    if constexpr (std::is_same_v<Rows, Q6Interleaved>) {
      // two groups at a time while two whole groups are left
      if (r0 + 2 * kRows <= n_rows) {
        const Rows rows_b(w, w_stride, r0 + kRows, n_rows, nsb);
        group_panels<TilePairQ6K, kQ6KPairPanel, 4>(
            nsb, n_tok,
            pair_panels(rows.stream(), size_t(rows_b.group - rows.group), kRows * sizeof(block_q6_K), nsb,
                        kQ6KPairPanel),
            [&](int64_t sb, TilePairQ6K& tile) {
              unpack_q6K(rows, sb, tile.g[0]);
              unpack_q6K(rows_b, sb, tile.g[1]);
            },
            [&](auto T, int64_t t0, const TilePairQ6K* tiles, int64_t sb0, int64_t np, StreamPrefetch& pf) {
              q6K_pair_tokens<decltype(T)::value>(tiles, np, ab + size_t(t0) * a_stride + size_t(sb0) * sizeof(block_q8_K),
                                                  a_stride, offsets_delta(offs, ab, sb0), y + t0 * ldy + r0, ldy,
                                                  sb0 == 0, pf);
            });
        r0 += kRows;  // the pair's second group
        continue;
      }
    }
    group_panels<TileQ6K>(
        nsb, n_tok, stream_panels(rows.stream(), kRows * sizeof(block_q6_K), nsb, kPanelBytes / sizeof(TileQ6K)),
        [&](int64_t sb, TileQ6K& tile) { unpack_q6K(rows, sb, tile); },
        [&](auto T, int64_t t0, const TileQ6K* tiles, int64_t sb0, int64_t np, StreamPrefetch& pf) {
          q6K_tokens<decltype(T)::value>(tiles, np, ab + size_t(t0) * a_stride + size_t(sb0) * sizeof(block_q8_K),
                                         a_stride, offsets_delta(offs, ab, sb0), y + t0 * ldy + r0, ldy, rows.mask,
                                         sb0 == 0, pf);
        });
  }
}

// ============================ 32-element formats x Q8_0 ============================
//
// A unit is up to 8 blocks (256 elements): group g of the tile is block g / 8's quants 4 (g % 8)
// .. + 3, unsigned (stored value + the format's offset).

constexpr int kUnitBlocks = 8;

struct Tile32 {
  __m512i q[8 * kUnitBlocks];
  __m512 d[kUnitBlocks];  // float scale of each block, per row
};

// Per token and block: the accumulator's start, -offset * sum(a), and the activation scale.
struct TokenBlock {
  int32_t start;
  float d;
};

void token_blocks_q8_0(const uint8_t* a, size_t a_stride, int64_t n_tok, int64_t nb, int offset,
                       std::vector<TokenBlock>& out) {
  out.resize(size_t(n_tok * nb));
  TokenBlock* o = out.data();
  const __m256i ones = _mm256_set1_epi8(1);
  for (int64_t t = 0; t < n_tok; ++t) {
    const auto* blocks = reinterpret_cast<const block_q8_0*>(a + size_t(t) * a_stride);
    for (int64_t b = 0; b < nb; ++b, ++o) {
      // sum of the 32 quants: |q| * sign(q) pairs summed, then the 8 lanes
      const __m256i q = load32(blocks[b].qs);
      const __m256i s16 = _mm256_maddubs_epi16(ones, q);
      const __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
      __m128i v = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
      v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0x4E));
      v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0xB1));
      o->start = -offset * _mm_cvtsi128_si32(v);
      o->d = half_to_float(blocks[b].d);
    }
  }
}

// Tokens t0 .. t0 + T against a panel of nblk blocks (units of kUnitBlocks in tiles[]): a and tb
// at the panel's first block of token t0.
template <int T>
void tokens_32(const Tile32* tiles, int64_t nblk, const uint8_t* a, size_t a_stride, const TokenBlock* tb,
               size_t tb_stride, float* y, int64_t ldy, __mmask16 mask, bool first) {
  __m512 sum[T];
  for (int t = 0; t < T; ++t) sum[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nblk; ++b) {
    const Tile32& tile = tiles[b / kUnitBlocks];
    const int64_t j = b % kUnitBlocks;
    __m512i acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm512_set1_epi32(tb[size_t(t) * tb_stride + size_t(b)].start);
    const uint8_t* qs = a + sizeof(block_q8_0) * size_t(b) + offsetof(block_q8_0, qs);
    for (int g = 0; g < 8; ++g) {
      const __m512i w = tile.q[8 * j + g];
      for (int t = 0; t < T; ++t)
        acc[t] = _mm512_dpbusd_epi32(acc[t], w, bcast4(qs + size_t(t) * a_stride + 4 * g));
    }
    for (int t = 0; t < T; ++t) {
      const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[t]), _mm512_set1_ps(tb[size_t(t) * tb_stride + size_t(b)].d));
      sum[t] = _mm512_fmadd_ps(v, tile.d[j], sum[t]);
    }
  }
  for (int t = 0; t < T; ++t) store_rows(y + t * ldy, mask, sum[t], first);
}

// Fills tile.q for blocks [b0, b0 + nblk) (nblk <= 8): `quads(rows, b, r)` loads, for each row, 64
// bytes that transpose to blocks b .. b + 3's 4-bit fields, or for Q8_0 b .. b + 1's quants.
struct Q8_0Format {
  static constexpr int kOffset = 128;
  static constexpr size_t kBlock = sizeof(block_q8_0);
  static void unpack(const RowTile& rt, int64_t b0, int nblk, Tile32& tile) {
    for (int p = 0; p < nblk; p += 2) {
      const int64_t b1 = b0 + p + (p + 1 < nblk ? 1 : 0);
      __m512i r[16];
      for (int i = 0; i < kRows; ++i) {
        const uint8_t* row = rt.rows[i];
        const __m256i lo = load32(row + size_t(b0 + p) * kBlock + offsetof(block_q8_0, qs));
        const __m256i hi = load32(row + size_t(b1) * kBlock + offsetof(block_q8_0, qs));
        r[i] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
      }
      transpose_16x16(r);
      const __m512i flip = _mm512_set1_epi8(char(0x80));  // q + 128 as u8
      const int groups = p + 1 < nblk ? 16 : 8;
      for (int j = 0; j < groups; ++j) tile.q[8 * p + j] = _mm512_xor_si512(r[j], flip);
    }
    for (int b = 0; b < nblk; ++b) {
      alignas(32) uint16_t dh[kRows];
      for (int i = 0; i < kRows; ++i) std::memcpy(&dh[i], rt.rows[i] + size_t(b0 + b) * kBlock, 2);
      tile.d[b] = _mm512_cvtph_ps(load32(dh));
    }
  }
};

// 4-bit formats: nibble j of qs[j] is element j, its high nibble element j + 16; the value is
// table[nibble] (stored + offset, unsigned).
template <class Block>
void unpack_nibbles(const RowTile& rt, int64_t b0, int nblk, __m128i table, Tile32& tile) {
  const __m512i tab = _mm512_broadcast_i32x4(table);
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  for (int p = 0; p < nblk; p += 4) {
    __m512i r[16];
    for (int i = 0; i < kRows; ++i) {
      const uint8_t* qs = rt.rows[i] + offsetof(Block, qs);
      // block p + k (a tail repeats block p); the lane index must be an immediate at any -O
      auto blk = [&](int k) { return load16(qs + size_t(b0 + p + (p + k < nblk ? k : 0)) * sizeof(Block)); };
      __m512i v = _mm512_castsi128_si512(blk(0));
      v = _mm512_inserti32x4(v, blk(1), 1);
      v = _mm512_inserti32x4(v, blk(2), 2);
      v = _mm512_inserti32x4(v, blk(3), 3);
      r[i] = v;
    }
    transpose_16x16(r);
    // dword j: block p + j / 4, bytes 4 (j % 4) + i: low nibbles are elements 4 (j % 4) + i (group
    // j % 4 of the block), high nibbles elements 16 + 4 (j % 4) + i (group 4 + j % 4)
    for (int j = 0; j < 16 && p + j / 4 < nblk; ++j) {
      const int g = 8 * (p + j / 4) + j % 4;
      tile.q[g] = _mm512_shuffle_epi8(tab, _mm512_and_si512(r[j], m4));
      tile.q[g + 4] = _mm512_shuffle_epi8(tab, _mm512_and_si512(_mm512_srli_epi32(r[j], 4), m4));
    }
  }
}

template <class Block>
void unpack_half_scales(const RowTile& rt, int64_t b0, int nblk, Tile32& tile) {
  static_assert(offsetof(Block, d) == 0);
  for (int b = 0; b < nblk; ++b) {
    alignas(32) uint16_t dh[kRows];
    for (int i = 0; i < kRows; ++i) std::memcpy(&dh[i], rt.rows[i] + size_t(b0 + b) * sizeof(Block), 2);
    tile.d[b] = _mm512_cvtph_ps(load32(dh));
  }
}

struct Q4_0Format {
  static constexpr int kOffset = 8;
  static void unpack(const RowTile& rt, int64_t b0, int nblk, Tile32& tile) {
    unpack_nibbles<block_q4_0>(rt, b0, nblk, _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), tile);
    unpack_half_scales<block_q4_0>(rt, b0, nblk, tile);
  }
};
struct Iq4NlFormat {
  static constexpr int kOffset = 127;
  static void unpack(const RowTile& rt, int64_t b0, int nblk, Tile32& tile) {
    unpack_nibbles<block_iq4_nl>(rt, b0, nblk, _mm_add_epi8(load16(kvalues_iq4nl), _mm_set1_epi8(127)), tile);
    unpack_half_scales<block_iq4_nl>(rt, b0, nblk, tile);
  }
};
struct Mxfp4Format {
  static constexpr int kOffset = 12;
  static void unpack(const RowTile& rt, int64_t b0, int nblk, Tile32& tile) {
    unpack_nibbles<block_mxfp4>(rt, b0, nblk, _mm_add_epi8(load16(kvalues_mxfp4), _mm_set1_epi8(12)), tile);
    for (int b = 0; b < nblk; ++b) {
      alignas(64) float d[kRows];
      for (int i = 0; i < kRows; ++i) d[i] = e8m0_half(rt.rows[i][size_t(b0 + b) * sizeof(block_mxfp4)]);
      tile.d[b] = _mm512_load_ps(d);
    }
  }
};

// The 16 rows of a tile of a 32-element format, in the file layout: F::unpack transposes them.
template <class F>
struct FileRows32 {
  static constexpr int kOffset = F::kOffset;
  RowTile rt;
  __mmask16 mask;
  FileRows32(const void* w, size_t w_stride, int64_t r0, int64_t n_rows, int64_t /*nb*/)
      : rt(row_tile(w, w_stride, r0, n_rows)), mask(rt.mask) {}
  void unpack(int64_t b0, int nblk, Tile32& tile) const { F::unpack(rt, b0, nblk, tile); }
  const uint8_t* stream() const { return nullptr; }
  bool gemv(const uint8_t*, const TokenBlock*, float*) const { return false; }  // no decode kernel of its own
};

// Tiles of a 32-element format over 16 rows at a time from `Rows` (FileRows32 or
// InterleavedRows32 below): one token may go to the rows' own decode kernel; otherwise units of
// up to 8 blocks are unpacked into Tile32s, panels of which are shared by blocks of up to 8 tokens.
template <class Rows>
void gemm_32(int64_t n, const void* w, size_t w_stride, int64_t n_rows, const void* a, size_t a_stride,
             int64_t n_tok, float* y, int64_t ldy) {
  const int64_t nb = n / 32;
  const auto* ab = static_cast<const uint8_t*>(a);
  thread_local std::vector<TokenBlock> tbs;
  token_blocks_q8_0(ab, a_stride, n_tok, nb, Rows::kOffset, tbs);
  const int64_t n_units = (nb + kUnitBlocks - 1) / kUnitBlocks;
  const size_t unit_bytes = kRows * (w_stride / size_t(nb)) * kUnitBlocks;  // in an interleaved stream
  for (int64_t r0 = 0; r0 < n_rows; r0 += kRows) {
    const Rows rows(w, w_stride, r0, n_rows, nb);
    // up to kFusedMaxTokens tokens, each on the decode kernel where the rows have one (the group
    // stays in cache): every token's sums run in the one-token order
    if (n_tok <= kFusedMaxTokens && rows.gemv(ab, tbs.data(), y + r0)) {
      for (int64_t t = 1; t < n_tok; ++t) rows.gemv(ab + size_t(t) * a_stride, tbs.data() + size_t(t * nb), y + t * ldy + r0);
      continue;
    }
    group_panels<Tile32>(
        n_units, n_tok, stream_panels(rows.stream(), unit_bytes, n_units, kPanelBytes / sizeof(Tile32)),
        [&](int64_t u, Tile32& tile) {
          rows.unpack(u * kUnitBlocks, int(std::min<int64_t>(kUnitBlocks, nb - u * kUnitBlocks)), tile);
        },
        [&](auto T, int64_t t0, const Tile32* tiles, int64_t u0, int64_t nu, StreamPrefetch&) {
          const int64_t b0 = u0 * kUnitBlocks, nblk = std::min(nu * kUnitBlocks, nb - b0);
          tokens_32<decltype(T)::value>(tiles, nblk, ab + size_t(t0) * a_stride + size_t(b0) * sizeof(block_q8_0),
                                        a_stride, tbs.data() + size_t(t0 * nb + b0), size_t(nb), y + t0 * ldy + r0,
                                        ldy, rows.mask, u0 == 0);
        });
  }
}

// ---- 32-element formats, row-interleaved (cpu/repack.h) ----
//
// Each block of a group is the 16 rows' scales (the head: kHead bytes per row) followed by the
// quant dwords, register g of which holds elements 4g .. 4g + 3 of every row once unpacked: no
// transpose. Decode (one token) goes straight from the loads to vpdpbusd; several tokens fill
// the same Tile32 as the file layout and share tokens_32.

struct Q8_0Interleaved {
  static constexpr int kOffset = 128;
  static constexpr size_t kBlock = sizeof(block_q8_0), kHead = 2;
  static constexpr int64_t kUnit = 2;
  static __m512 scales(const uint8_t* head) { return _mm512_cvtph_ps(load32(head)); }
  static void quants(const uint8_t* qs, __m512i q[8]) {
    const __m512i flip = _mm512_set1_epi8(char(0x80));  // q + 128 as u8
    for (int g = 0; g < 8; ++g) q[g] = _mm512_xor_si512(load64(qs + 64 * g), flip);
  }
};

// 4-bit formats: dword k of a block's 16 quant bytes holds elements 4k .. 4k + 3 in its low
// nibbles and 16 + 4k .. 16 + 4k + 3 in its high nibbles; the value is table[nibble] (+ offset).
template <size_t kBlockBytes, size_t kHeadBytes>
struct NibbleInterleaved {
  static constexpr size_t kBlock = kBlockBytes, kHead = kHeadBytes;
  static constexpr int64_t kUnit = 64 / (kRows * kHeadBytes);  // the heads of a unit: one cache line
  static void nibbles(const uint8_t* qs, __m128i table, __m512i q[8]) {
    const __m512i tab = _mm512_broadcast_i32x4(table), m4 = _mm512_set1_epi8(0x0F);
    for (int k = 0; k < 4; ++k) {
      const __m512i r = load64(qs + 64 * k);
      q[k] = _mm512_shuffle_epi8(tab, _mm512_and_si512(r, m4));
      q[k + 4] = _mm512_shuffle_epi8(tab, _mm512_and_si512(_mm512_srli_epi16(r, 4), m4));
    }
  }
};
struct Q4_0Interleaved : NibbleInterleaved<sizeof(block_q4_0), 2> {
  static constexpr int kOffset = 8;
  static __m512 scales(const uint8_t* head) { return _mm512_cvtph_ps(load32(head)); }
  static void quants(const uint8_t* qs, __m512i q[8]) {
    nibbles(qs, _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), q);
  }
};
struct Iq4NlInterleaved : NibbleInterleaved<sizeof(block_iq4_nl), 2> {
  static constexpr int kOffset = 127;
  static __m512 scales(const uint8_t* head) { return _mm512_cvtph_ps(load32(head)); }
  static void quants(const uint8_t* qs, __m512i q[8]) {
    nibbles(qs, _mm_add_epi8(load16(kvalues_iq4nl), _mm_set1_epi8(127)), q);
  }
};
struct Mxfp4Interleaved : NibbleInterleaved<sizeof(block_mxfp4), 1> {
  static constexpr int kOffset = 12;
  // e8m0_half of each row's exponent byte: 2^(e - 128), e = 0 and 1 as denormals
  static __m512 scales(const uint8_t* head) {
    const __m512i e = _mm512_cvtepu8_epi32(load16(head));
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __m512i tiny = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2)), normal, tiny));
  }
  static void quants(const uint8_t* qs, __m512i q[8]) {
    nibbles(qs, _mm_add_epi8(load16(kvalues_mxfp4), _mm_set1_epi8(12)), q);
  }
};

// Decode prefetch distance for these formats (bytes ahead in the group's stream).
constexpr size_t kPrefetchAhead32 = 4096;  // 1088 and 8704 measured no better

// Where block b of a group (nb blocks per row) keeps its 16 scales and its quant registers
// (cpu/repack.h: units of F::kUnit blocks, heads first).
template <class F>
struct BlockAt {
  const uint8_t *head, *qs;
  BlockAt(const uint8_t* group, int64_t nb, int64_t b) {
    const int64_t ub = b / F::kUnit * F::kUnit, m = std::min<int64_t>(F::kUnit, nb - ub), j = b - ub;
    const uint8_t* base = group + size_t(ub) * F::kBlock * kRows;
    head = base + size_t(j) * kRows * F::kHead;
    qs = base + size_t(m) * kRows * F::kHead + size_t(j) * (F::kBlock - F::kHead) * kRows;
  }
};

// Unit by unit (the pointers of a unit's blocks computed once; whole units unrolled): against
// per-block addressing, two threads over interleaved MXFP4 stacks read 46.1-46.9 -> 48.3-49.8 GB/s
// from DRAM (a throwaway driver alternating both in one process).
template <class F>
void gemv_32_interleaved(int64_t nb, const uint8_t* group, const uint8_t* a, const TokenBlock* tb, float* y) {
  constexpr size_t kGroupBlock = F::kBlock * kRows;
  __m512 sum = _mm512_setzero_ps();
  auto block = [&](int64_t b, const uint8_t* head, const uint8_t* qs_w) {
    __m512i q[8];
    F::quants(qs_w, q);
    const uint8_t* qs = a + size_t(b) * sizeof(block_q8_0) + offsetof(block_q8_0, qs);
    __m512i acc0 = _mm512_set1_epi32(tb[b].start), acc1 = _mm512_setzero_si512();
    for (int g = 0; g < 8; g += 2) {
      acc0 = _mm512_dpbusd_epi32(acc0, q[g], bcast4(qs + 4 * g));
      acc1 = _mm512_dpbusd_epi32(acc1, q[g + 1], bcast4(qs + 4 * g + 4));
    }
    const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(acc0, acc1)), _mm512_set1_ps(tb[b].d));
    sum = _mm512_fmadd_ps(v, F::scales(head), sum);
  };
  // a unit: the heads of its m blocks, then their quants (cpu/repack.h; BlockAt for one block)
  for (int64_t ub = 0; ub < nb; ub += F::kUnit) {
    const uint8_t* base = group + size_t(ub) * kGroupBlock;
    {  // a unit's lines at once (aligned: kUnit blocks of 16 rows are whole lines)
      const char* pf = reinterpret_cast<const char*>(base) + kPrefetchAhead32;
      for (size_t l = 0; l < kGroupBlock * F::kUnit; l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
    }
    const int64_t m = std::min<int64_t>(F::kUnit, nb - ub);
    if (m == F::kUnit) {
      const uint8_t* qs0 = base + size_t(F::kUnit) * kRows * F::kHead;
#pragma GCC unroll 8
      for (int64_t j = 0; j < F::kUnit; ++j)
        block(ub + j, base + size_t(j) * kRows * F::kHead, qs0 + size_t(j) * (F::kBlock - F::kHead) * kRows);
    } else {
      const uint8_t* qs0 = base + size_t(m) * kRows * F::kHead;
      for (int64_t j = 0; j < m; ++j)
        block(ub + j, base + size_t(j) * kRows * F::kHead, qs0 + size_t(j) * (F::kBlock - F::kHead) * kRows);
    }
  }
  _mm512_storeu_ps(y, sum);
}

// The same over a row-interleaved group: plain loads, and a decode kernel of its own.
template <class F>
struct InterleavedRows32 {
  static constexpr int kOffset = F::kOffset;
  const uint8_t* group;
  int64_t nb;
  __mmask16 mask = 0xFFFF;
  InterleavedRows32(const void* w, size_t w_stride, int64_t r0, int64_t /*n_rows*/, int64_t nb_)
      : group(static_cast<const uint8_t*>(w) + size_t(r0) * w_stride), nb(nb_) {}
  void unpack(int64_t b0, int nblk, Tile32& tile) const {
    for (int b = 0; b < nblk; ++b) {
      const BlockAt<F> blk(group, nb, b0 + b);
      tile.d[b] = F::scales(blk.head);
      F::quants(blk.qs, &tile.q[8 * b]);
    }
  }
  bool gemv(const uint8_t* a, const TokenBlock* tb, float* y) const {
    gemv_32_interleaved<F>(nb, group, a, tb, y);
    return true;
  }
  const uint8_t* stream() const { return group; }
};

// ---- F16 / BF16 weights x float activations ----
//
// 16 rows x 256 elements widened to float and transposed (16 x 16 blocks) into L1 scratch, so that
// one register holds element k of the 16 rows; then per token one FMA with the broadcast
// activation per element, tokens in blocks of up to kTok. Partial sums over the 256-element
// chunks accumulate in y. Float FMA throughout (the reference sums in double: float rounding of
// n-term sums, as the vec_dot kernels).

struct F32Weights {
  static constexpr size_t kBytes = 4;
  static __m512 load16(const uint8_t* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
};
struct F16Weights {
  static constexpr size_t kBytes = 2;
  static __m512 load16(const uint8_t* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
};
struct Bf16Weights {
  static constexpr size_t kBytes = 2;
  static __m512 load16(const uint8_t* p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
  }
};

constexpr int64_t kFloatChunk = 256;

template <int T>
void float_tokens(const float (*wt)[16], int64_t kk, const uint8_t* a, size_t a_stride, float* y, int64_t ldy,
                  __mmask16 mask, bool first) {
  __m512 acc[T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kk; ++k) {
    const __m512 wv = _mm512_load_ps(wt[k]);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      float x;
      std::memcpy(&x, a + size_t(t) * a_stride + size_t(k) * sizeof(float), sizeof x);
      acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(x), wv, acc[t]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    float* yt = y + t * ldy;
    if (!first) acc[t] = _mm512_add_ps(acc[t], _mm512_maskz_loadu_ps(mask, yt));
    _mm512_mask_storeu_ps(yt, mask, acc[t]);
  }
}

// BF16 and F32, row-interleaved (cpu/repack.h): register k holds elements 2k, 2k + 1 of the 16
// rows as bf16 pairs (BF16: widened to float by a shift for the even element and a mask for the
// odd one), or element k of the 16 rows (F32); one FMA per element with the broadcast activation.
// No transpose; one token block re-reads the group (from L2 after the first). A software prefetch
// 4 KiB ahead as for the other decode kernels.
struct Bf16Pairs {
  static constexpr int kPerReg = 2;  // elements per 64-byte register
  static void expand(__m512i r, __m512 v[2]) {
    v[0] = _mm512_castsi512_ps(_mm512_slli_epi32(r, 16));
    v[1] = _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32(int(0xFFFF0000u))));
  }
};
struct F32Lanes {
  static constexpr int kPerReg = 1;
  static void expand(__m512i r, __m512 v[1]) { v[0] = _mm512_castsi512_ps(r); }
};

template <class W, int T>
void float_interleaved_tokens(int64_t n, const uint8_t* group, const uint8_t* a, size_t a_stride, float* y,
                              int64_t ldy) {
  constexpr int P = W::kPerReg;
  constexpr int kSets = T <= 2 ? 4 / P : 1;  // independent accumulators per token and element (FMA latency)
  __m512 acc[T][P * kSets];
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < P * kSets; ++j) acc[t][j] = _mm512_setzero_ps();
  auto step = [&](int64_t k, int set) {
    const uint8_t* p = group + 64 * size_t(k);
    _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchAhead32, _MM_HINT_T0);
    __m512 v[P];
    W::expand(load64(p), v);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      float x[P];
      std::memcpy(x, a + size_t(t) * a_stride + size_t(k) * P * sizeof(float), sizeof x);
      for (int e = 0; e < P; ++e)
        acc[t][P * set + e] = _mm512_fmadd_ps(v[e], _mm512_set1_ps(x[e]), acc[t][P * set + e]);
    }
  };
  const int64_t nr = n / P;
  int64_t k = 0;
  for (; k + kSets <= nr; k += kSets)
    for (int set = 0; set < kSets; ++set) step(k + set, set);
  for (; k < nr; ++k) step(k, 0);
  for (int t = 0; t < T; ++t) {
    __m512 sum = acc[t][0];
    for (int j = 1; j < P * kSets; ++j) sum = _mm512_add_ps(sum, acc[t][j]);
    _mm512_storeu_ps(y + t * ldy, sum);
  }
}

template <class W>
void gemm_float_interleaved(int64_t n, const void* w, size_t w_stride, int64_t n_rows, const void* a, size_t a_stride,
                            int64_t n_tok, float* y, int64_t ldy) {
  const auto* ab = static_cast<const uint8_t*>(a);
  for (int64_t r0 = 0; r0 < n_rows; r0 += kRows) {
    const uint8_t* group = static_cast<const uint8_t*>(w) + size_t(r0) * w_stride;
    if (n_tok <= kFusedMaxTokens) {
      // blocks of at most 2 tokens: their accumulator sets are the one-token kernel's, so each
      // token's sum runs in the one-token order
      int64_t t0 = 0;
      for (; t0 + 2 <= n_tok; t0 += 2)
        float_interleaved_tokens<W, 2>(n, group, ab + size_t(t0) * a_stride, a_stride, y + t0 * ldy + r0, ldy);
      if (t0 < n_tok) float_interleaved_tokens<W, 1>(n, group, ab + size_t(t0) * a_stride, a_stride, y + t0 * ldy + r0, ldy);
      continue;
    }
    for_token_blocks(n_tok, [&](auto T, int64_t t0) {
      float_interleaved_tokens<W, decltype(T)::value>(n, group, ab + size_t(t0) * a_stride, a_stride,
                                                       y + t0 * ldy + r0, ldy);
    });
  }
}

template <class W>
void gemm_float16(int64_t n, const void* w, size_t w_stride, int64_t n_rows, const void* a, size_t a_stride,
                  int64_t n_tok, float* y, int64_t ldy) {
  if (n == 0) {
    for (int64_t t = 0; t < n_tok; ++t) std::fill(y + t * ldy, y + t * ldy + n_rows, 0.0f);
    return;
  }
  alignas(64) float wt[kFloatChunk][16];
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* ab = static_cast<const uint8_t*>(a);
  for (int64_t r0 = 0; r0 < n_rows; r0 += kRows) {
    const int rows = int(std::min<int64_t>(kRows, n_rows - r0));
    const __mmask16 mask = _cvtu32_mask16(rows == 16 ? 0xFFFFu : (1u << rows) - 1);
    for (int64_t k0 = 0; k0 < n; k0 += kFloatChunk) {
      const int64_t kk = std::min(kFloatChunk, n - k0);
      for (int64_t kb = 0; kb < kk; kb += 16) {
        const int m = int(std::min<int64_t>(16, kk - kb));
        const __mmask16 km = _cvtu32_mask16(m == 16 ? 0xFFFFu : (1u << m) - 1);
        __m512i r[16];
        for (int i = 0; i < 16; ++i)
          r[i] = i < rows ? _mm512_castps_si512(W::load16(wb + size_t(r0 + i) * w_stride + size_t(k0 + kb) * W::kBytes, km))
                          : _mm512_setzero_si512();
        transpose_16x16(r);
        for (int j = 0; j < m; ++j) _mm512_store_ps(wt[kb + j], _mm512_castsi512_ps(r[j]));
      }
      for_token_blocks(n_tok, [&](auto T, int64_t t0) {
        float_tokens<decltype(T)::value>(wt, kk, ab + size_t(t0) * a_stride + size_t(k0) * sizeof(float), a_stride,
                                         y + t0 * ldy + r0, ldy, mask, k0 == 0);
      });
    }
  }
}

}  // namespace

namespace detail {

void add_avx512_gemm(GemmFn* gemm) {
  gemm[size_t(GgmlType::f32)] = gemm_float16<F32Weights>;
  gemm[size_t(GgmlType::f16)] = gemm_float16<F16Weights>;
  gemm[size_t(GgmlType::bf16)] = gemm_float16<Bf16Weights>;
  gemm[size_t(GgmlType::q4_k)] = gemm_q45K<block_q4_K, false, FileRows>;
  gemm[size_t(GgmlType::q5_k)] = gemm_q45K<block_q5_K, true, FileRows>;
  gemm[size_t(GgmlType::q6_k)] = gemm_q6K<Q6FileRows>;
  gemm[size_t(GgmlType::q8_0)] = gemm_32<FileRows32<Q8_0Format>>;
  gemm[size_t(GgmlType::q4_0)] = gemm_32<FileRows32<Q4_0Format>>;
  gemm[size_t(GgmlType::iq4_nl)] = gemm_32<FileRows32<Iq4NlFormat>>;
  gemm[size_t(GgmlType::mxfp4)] = gemm_32<FileRows32<Mxfp4Format>>;
}

void add_avx512_gemm_interleaved(GemmFn* gemm) {
  gemm[size_t(GgmlType::q4_k)] = gemm_q45K<block_q4_K, false, Interleaved>;
  gemm[size_t(GgmlType::q5_k)] = gemm_q45K<block_q5_K, true, Interleaved>;
  gemm[size_t(GgmlType::q6_k)] = gemm_q6K<Q6Interleaved>;
  gemm[size_t(GgmlType::q8_0)] = gemm_32<InterleavedRows32<Q8_0Interleaved>>;
  gemm[size_t(GgmlType::q4_0)] = gemm_32<InterleavedRows32<Q4_0Interleaved>>;
  gemm[size_t(GgmlType::iq4_nl)] = gemm_32<InterleavedRows32<Iq4NlInterleaved>>;
  gemm[size_t(GgmlType::mxfp4)] = gemm_32<InterleavedRows32<Mxfp4Interleaved>>;
  gemm[size_t(GgmlType::bf16)] = gemm_float_interleaved<Bf16Pairs>;
  gemm[size_t(GgmlType::f32)] = gemm_float_interleaved<F32Lanes>;
}

}  // namespace detail
}  // namespace strata::cpu
