// Row-interleaved weight layout (issue #4, deliverable 3), made on the way into RAM.
//
// In the file a matrix is row after row. The tile kernels want, for 16 rows at a time, the same
// four bytes of every row side by side: one 64-byte register then holds one dword of each of the
// 16 rows, i.e. one int32 lane per row, and vpdpbusd adds four products to all 16 rows at once
// (AVX2 reads each such line as two 32-byte registers, rows 0..7 and 8..15).
// Read from the file layout that needs a 16 x 16 dword transpose per 64 bytes of each row, in the
// kernel, every time the weights are used (gemm_avx512.cpp does it for the file layout).
// Interleaving does that transpose once, at load:
//
//   a group is 16 consecutive rows r0 .. r0 + 15 of one matrix (r0 a multiple of 16); its bytes
//   (16 x row_bytes, where the 16 rows were) hold the rows' blocks in units of `unit` blocks (the
//   last unit of a row may have fewer, m). A unit starting at block b lies at 16 b block bytes:
//   first the `head` bytes of its blocks (block b + j of row i at (16 j + i) head: the scales a
//   block starts with), then their dwords (dword k of block b + j of row i at 16 m head +
//   64 (j nd + k) + 4 i, nd = (block - head - tail) / 4 dwords per block), then the `tail`
//   bytes (the scale a block ends with: block b + j of row i at 16 m head + 64 m nd +
//   (16 j + i) tail).
//
// Q4_K / Q5_K have neither (their scales are whole dwords) and units of one block; Q8_0, Q4_0 and
// IQ4_NL a 2-byte head (d) and units of 2 blocks, MXFP4 a 1-byte head (the exponent) and units of
// 4, Q6_K a 2-byte tail (d) and units of 2: the heads or tails of a unit fill 64 bytes, so every
// quant register is one aligned cache line. BF16's "block" is a pair of elements: register k holds
// elements 2k and 2k + 1 of the 16 rows (oneDNN's BA16a16b2a weight layout when n_in and n_out
// are multiples of 16); F32's is one element (register k: element k of the 16 rows). Only whole
// groups are interleaved: the last
// n_out % 16 rows of each matrix stay as in the file, so Weight::row(r) still points at row r
// there, and at the start of its group for r % 16 == 0. A type is interleaved only where the ISA
// has a kernel that reads it (KernelTable::gemm_interleaved).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu/weights.h"

namespace strata::cpu {

inline constexpr int kInterleaveRows = 16;

// A type's blocks in the interleaved layout: block bytes, head and tail bytes per block and row,
// blocks per unit (block 0: the type has no interleaved layout).
struct InterleaveLayout {
  size_t block = 0, head = 0, tail = 0, unit = 1;
};
InterleaveLayout interleave_layout(GgmlType type);

// Whether `w` can be interleaved for the running kernel table: a matrix type with an interleaved
// kernel and a layout, at least one whole group. (False once it is interleaved.)
bool can_interleave(const Weight& w);

// In place: every whole group of every matrix of the stack interleaved, on compute_pool() (or on
// the calling thread: the NVMe tier's reader threads, while the pool computes). `data` must be
// writable and be w.data. Sets w.interleaved. Precondition: can_interleave(w).
void interleave(Weight& w, uint8_t* data, bool on_pool = true);

// 16 rows of row_bytes each (src, contiguous) -> the group layout of `type` (dst). No overlap.
void interleave_group(GgmlType type, const uint8_t* src, size_t row_bytes, uint8_t* dst);
// Row i (0..15) of a group back in the file layout: dst[0 .. row_bytes).
void deinterleave_row(GgmlType type, const uint8_t* group, size_t row_bytes, int i, uint8_t* dst);

// Row r of matrix `mat` of w in the file layout: a pointer into w where it is stored so,
// otherwise deinterleaved into tmp (row_bytes) and tmp returned.
const uint8_t* file_row(const Weight& w, int64_t r, int64_t mat, uint8_t* tmp);

}  // namespace strata::cpu
