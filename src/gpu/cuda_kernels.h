// The first kernels of the CUDA backend (issue #7): a matrix-vector product on weights in their
// GGUF block layout (F32, BF16, Q8_0, Q4_K, MXFP4), dequantized in the kernel, float activations
// and float accumulation. A reference-grade kernel (one warp per row, element by element):
// correct first; the fast kernels and the Backend interface build on it. No CUDA type appears
// here; builds without the CUDA library get errors that say so.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/error.h"
#include "model/ggml_type.h"

namespace strata::gpu {

// Whether a CUDA device and driver are usable (false in builds without CUDA).
bool cuda_usable();

// y[r] = sum_k W[r][k] x[k] for r < n_rows, k < n_cols, on device 0. w: n_rows rows of row_bytes
// in the file's layout (not row-interleaved), x: n_cols floats, y: n_rows floats, all host
// memory (copied in and out). Errors: no device, a type it has no kernel for, a CUDA failure.
Status cuda_matvec(GgmlType type, const uint8_t* w, int64_t n_rows, int64_t n_cols, size_t row_bytes, const float* x,
                   float* y);

}  // namespace strata::gpu
