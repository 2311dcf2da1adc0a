#include "cpu/repack.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "cpu/kernels.h"
#include "cpu/thread_pool.h"

namespace strata::cpu {

InterleaveLayout interleave_layout(GgmlType type) {
  switch (type) {
    case GgmlType::q4_k: return {144, 0, 0, 1};
    case GgmlType::q5_k: return {176, 0, 0, 1};
    case GgmlType::q6_k: return {210, 0, 2, 2};
    case GgmlType::q8_0: return {34, 2, 0, 2};
    case GgmlType::q4_0: return {18, 2, 0, 2};
    case GgmlType::iq4_nl: return {18, 2, 0, 2};
    case GgmlType::mxfp4: return {17, 1, 0, 4};
    case GgmlType::bf16: return {4, 0, 0, 1};  // a pair of elements
    case GgmlType::f32: return {4, 0, 0, 1};   // one element
    default: return {};
  }
}

bool can_interleave(const Weight& w) {
  const InterleaveLayout l = interleave_layout(w.type);
  return w && !w.interleaved && l.block != 0 && (l.block - l.head - l.tail) % 4 == 0 &&
         w.row_bytes % l.block == 0 && cpu_kernels().gemm_interleaved[size_t(w.type)] != nullptr &&
         w.n_out >= kInterleaveRows;
}

namespace {

// Calls fn(row i, offset in the row, offset in the group, bytes) for every piece of a group (of
// row `only` alone when it is 0..15).
template <class Fn>
void for_each_piece(GgmlType type, size_t row_bytes, Fn&& fn, int only = -1) {
  const InterleaveLayout l = interleave_layout(type);
  STRATA_CHECK(l.block != 0 && row_bytes % l.block == 0, "no interleaved layout for this type");
  const size_t R = kInterleaveRows, nd = (l.block - l.head - l.tail) / 4, nb = row_bytes / l.block;
  for (size_t b = 0; b < nb; b += l.unit) {
    const size_t m = std::min(l.unit, nb - b), base = b * l.block * R;
    const size_t dwords = base + R * m * l.head, tails = dwords + 64 * m * nd;
    for (size_t j = 0; j < m; ++j) {
      const size_t src = (b + j) * l.block;
      for (size_t i = only < 0 ? 0 : size_t(only); i < (only < 0 ? R : size_t(only) + 1); ++i) {
        if (l.head) fn(i, src, base + (R * j + i) * l.head, l.head);
        for (size_t k = 0; k < nd; ++k) fn(i, src + l.head + 4 * k, dwords + 64 * (j * nd + k) + 4 * i, 4);
        if (l.tail) fn(i, src + l.head + 4 * nd, tails + (R * j + i) * l.tail, l.tail);
      }
    }
  }
}

}  // namespace

void interleave_group(GgmlType type, const uint8_t* src, size_t row_bytes, uint8_t* dst) {
  // for_each_piece's order, specialised: each 64-byte register of dwords written whole from the 16
  // rows: 3.7 -> 12-15 GB/s for a Q4_K / Q6_K expert matrix in L2 (the NVMe tier interleaves every
  // expert it reads)
  const InterleaveLayout l = interleave_layout(type);
  STRATA_CHECK(l.block != 0 && row_bytes % l.block == 0, "no interleaved layout for this type");
  constexpr size_t R = kInterleaveRows;
  const size_t nd = (l.block - l.head - l.tail) / 4, nb = row_bytes / l.block;
  for (size_t b = 0; b < nb; b += l.unit) {
    const size_t m = std::min(l.unit, nb - b), base = b * l.block * R;
    const size_t dwords = base + R * m * l.head, tails = dwords + 64 * m * nd;
    for (size_t j = 0; j < m; ++j) {
      const uint8_t* blk = src + (b + j) * l.block;
      for (size_t i = 0; i < R; ++i) {
        if (l.head) std::memcpy(dst + base + (R * j + i) * l.head, blk + i * row_bytes, l.head);
        if (l.tail) std::memcpy(dst + tails + (R * j + i) * l.tail, blk + i * row_bytes + l.head + 4 * nd, l.tail);
      }
      uint8_t* out = dst + dwords + 64 * j * nd;
      const uint8_t* in = blk + l.head;
      for (size_t k = 0; k < nd; ++k, out += 64, in += 4) {
        uint32_t reg[R];
        for (size_t i = 0; i < R; ++i) std::memcpy(&reg[i], in + i * row_bytes, 4);
        std::memcpy(out, reg, 64);
      }
    }
  }
}

void deinterleave_row(GgmlType type, const uint8_t* group, size_t row_bytes, int i, uint8_t* dst) {
  STRATA_CHECK(i >= 0 && i < kInterleaveRows, "row outside a group");
  for_each_piece(
      type, row_bytes, [&](size_t, size_t in_row, size_t in_group, size_t n) { std::memcpy(dst + in_row, group + in_group, n); },
      i);
}

void interleave(Weight& w, uint8_t* data, bool on_pool) {
  STRATA_CHECK(data == w.data && can_interleave(w));
  const int64_t groups_per_mat = w.n_out / kInterleaveRows;
  const int64_t n_groups = groups_per_mat * w.n_mat;
  const size_t group_bytes = w.row_bytes * kInterleaveRows;
  const int64_t per_task = std::max<int64_t>(1, (int64_t(1) << 20) / int64_t(group_bytes));  // ~1 MiB
  const Weight& cw = w;
  auto run_task = [&](int64_t task, int) {
    thread_local std::vector<uint8_t> tmp;
    tmp.resize(group_bytes);
    for (int64_t g = task * per_task; g < std::min(n_groups, (task + 1) * per_task); ++g) {
      const int64_t mat = g / groups_per_mat, r0 = (g % groups_per_mat) * kInterleaveRows;
      uint8_t* p = data + (cw.row(r0, mat) - cw.data);
      std::memcpy(tmp.data(), p, group_bytes);
      interleave_group(cw.type, tmp.data(), cw.row_bytes, p);
    }
  };
  const int64_t n_tasks = (n_groups + per_task - 1) / per_task;
  if (on_pool) {
    compute_pool().run(n_tasks, run_task);
  } else {
    for (int64_t i = 0; i < n_tasks; ++i) run_task(i, 0);
  }
  w.interleaved = true;
}

const uint8_t* file_row(const Weight& w, int64_t r, int64_t mat, uint8_t* tmp) {
  if (!w.interleaved || r >= w.n_out / kInterleaveRows * kInterleaveRows) return w.row(r, mat);
  const int64_t r0 = r / kInterleaveRows * kInterleaveRows;
  deinterleave_row(w.type, w.row(r0, mat), w.row_bytes, int(r - r0), tmp);
  return tmp;
}

}  // namespace strata::cpu
