// oneDNN's matmul for BF16 weights in prefill (issue #4 item 6): where strata's own F16 / BF16
// tile kernel (float FMA after widening) is slower than oneDNN's vdpbf16ps kernels. Measured on the
// 2-core AVX-512 dev box, 2048 x 768 BF16 weights in the file's layout, batch 8 / 64 / 512
// (`strata_bench_kernels --benchmark_filter='BM_onednn_matmul/bf16/file|BM_gemm/bf16'`): oneDNN
// 186 / 304 / 664 GFLOP/s, strata 104 / 266 / 244. Matmul::matmul_batch therefore sends BF16
// matrices of kOnednnMinTokens tokens or more here, when they are in the file layout: weights
// read into RAM are row-interleaved (cpu/repack.h) for decode at memory speed, and on that layout
// strata's own tile (263 / 256 / 229) is as fast as oneDNN (its fast layout is BA16a64b2a, 64 rows
// per block; a decode kernel over 64-row groups would let both share it: not built).
//
// Numerics: the activations are rounded to BF16 first (as llama.cpp rounds them for BF16
// weights): a relative error of at most 2^-9 per activation, on top of float accumulation.
//
// Built when libdnnl-dev is found (STRATA_HAVE_ONEDNN); without it onednn_available() is false and
// the engine keeps its own kernels.
#pragma once

#include <cstdint>

#include "cpu/weights.h"

namespace strata::cpu {

inline constexpr int64_t kOnednnMinTokens = 64;

bool onednn_available();
// Whether this CPU runs oneDNN's BF16 matmul (it refuses CPUs without AVX-512: AVX2-only machines
// keep strata's own kernels). Probed once.
bool onednn_bf16_supported();

// y[t * ldy + n] = sum_k W[n][k] x[t][k] for t < n_tok, n < w.n_out: w a 2D BF16 weight in the
// file layout (row-interleaved weights are refused), x [n_tok][w.n_in] floats. Runs on oneDNN's own threads (OpenMP, as many as the
// compute pool has). Returns false (nothing written) when oneDNN is not available or refuses the
// shape.
bool onednn_matmul_bf16(const Weight& w, const float* x, int64_t n_tok, float* y, int64_t ldy);

}  // namespace strata::cpu
