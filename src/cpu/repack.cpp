#include "cpu/repack.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "cpu/kernels.h"
#include "cpu/thread_pool.h"

namespace strata::cpu {

bool can_interleave(const Weight& w) {
  return w && !w.interleaved && size_t(w.type) < kKernelTypeCount &&
         cpu_kernels().gemm_interleaved[size_t(w.type)] != nullptr && w.row_bytes % 4 == 0 &&
         w.n_out >= kInterleaveRows;
}

void interleave_group(const uint8_t* src, size_t row_bytes, uint8_t* dst) {
  const size_t n_dw = row_bytes / 4;
  for (size_t j = 0; j < n_dw; ++j)
    for (int i = 0; i < kInterleaveRows; ++i)
      std::memcpy(dst + (j * kInterleaveRows + size_t(i)) * 4, src + size_t(i) * row_bytes + j * 4, 4);
}

void deinterleave_row(const uint8_t* group, size_t row_bytes, int i, uint8_t* dst) {
  const size_t n_dw = row_bytes / 4;
  for (size_t j = 0; j < n_dw; ++j) std::memcpy(dst + j * 4, group + (j * kInterleaveRows + size_t(i)) * 4, 4);
}

void interleave(Weight& w, uint8_t* data) {
  STRATA_CHECK(data == w.data && can_interleave(w));
  const int64_t groups_per_mat = w.n_out / kInterleaveRows;
  const int64_t n_groups = groups_per_mat * w.n_mat;
  const size_t group_bytes = w.row_bytes * kInterleaveRows;
  const int64_t per_task = std::max<int64_t>(1, (int64_t(1) << 20) / int64_t(group_bytes));  // ~1 MiB
  const Weight& cw = w;
  compute_pool().run((n_groups + per_task - 1) / per_task, [&](int64_t task, int) {
    thread_local std::vector<uint8_t> tmp;
    tmp.resize(group_bytes);
    for (int64_t g = task * per_task; g < std::min(n_groups, (task + 1) * per_task); ++g) {
      const int64_t mat = g / groups_per_mat, r0 = (g % groups_per_mat) * kInterleaveRows;
      uint8_t* p = data + (cw.row(r0, mat) - cw.data);
      std::memcpy(tmp.data(), p, group_bytes);
      interleave_group(tmp.data(), cw.row_bytes, p);
    }
  });
  w.interleaved = true;
}

const uint8_t* file_row(const Weight& w, int64_t r, int64_t mat, uint8_t* tmp) {
  if (!w.interleaved || r >= w.n_out / kInterleaveRows * kInterleaveRows) return w.row(r, mat);
  const int64_t r0 = r / kInterleaveRows * kInterleaveRows;
  deinterleave_row(w.row(r0, mat), w.row_bytes, int(r - r0), tmp);
  return tmp;
}

}  // namespace strata::cpu
