// A weight matrix as it lies in the model file: a view, no copy. Rows are contiguous blocks of the
// file's type; stacked matrices (routed experts) follow each other.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/error.h"
#include "cpu/ggml_type.h"

namespace strata {

struct Weight {
  const uint8_t* data = nullptr;  // [n_mat][n_out][row_bytes], row-major, in the file's format
  GgmlType type = GgmlType::f32;
  int64_t n_in = 0;   // ne[0]: elements per row (the input dimension of y = W x)
  int64_t n_out = 0;  // ne[1]: rows (the output dimension); 1 for a vector
  int64_t n_mat = 1;  // ne[2]: stacked matrices (experts), 1 otherwise
  size_t row_bytes = 0;
  // The whole 16-row groups of each matrix are row-interleaved (cpu/repack.h): row(r) is then the
  // start of r's group where r % 16 == 0, and row r itself only in the last n_out % 16 rows.
  // Readers of single rows go through cpu::file_row.
  bool interleaved = false;

  explicit operator bool() const { return data != nullptr; }
  size_t mat_bytes() const { return row_bytes * size_t(n_out); }
  const uint8_t* row(int64_t r, int64_t mat = 0) const {
    return data + size_t(mat) * mat_bytes() + size_t(r) * row_bytes;
  }
  // Rows [r0, r0 + n) of a 2D weight (an interleaved one: at whole 16-row groups).
  Weight rows(int64_t r0, int64_t n) const {
    STRATA_CHECK(r0 >= 0 && n >= 0 && r0 + n <= n_out && n_mat == 1 &&
                 (!interleaved || (r0 % 16 == 0 && (n % 16 == 0 || r0 + n == n_out))));
    Weight w = *this;
    w.data = data + size_t(r0) * row_bytes;
    w.n_out = n;
    return w;
  }
  // F32 values in memory (a bias, sinks, a test's matrix) as a weight of n_out rows of n_in.
  static Weight f32(const float* v, int64_t n_in, int64_t n_out = 1) {
    Weight w;
    w.data = reinterpret_cast<const uint8_t*>(v);
    w.type = GgmlType::f32;
    w.n_in = n_in;
    w.n_out = n_out;
    w.row_bytes = size_t(n_in) * sizeof(float);
    return w;
  }
  // Matrix `e` of a stack as a plain 2D weight.
  Weight slice(int64_t e) const {
    Weight w = *this;
    w.data = data + size_t(e) * mat_bytes();
    w.n_mat = 1;
    return w;
  }
};

}  // namespace strata
