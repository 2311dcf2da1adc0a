// What strata's own kernels reach on this machine, for the planner (`strata calibrate` caches it
// as hardware.weights_gbps and hardware.cpu_int8_gops): a decode-like matrix-vector pass over
// expert matrices far larger than the caches, and a prefill-like GEMM. Both on Q4_K (the format of
// most MoE downloads), on random weights with valid scales.
#pragma once

#include "cpu/ggml_type.h"
#include "cpu/thread_pool.h"

namespace strata::cpu {

// GB/s of Q4_K weights read by matrix-vector products over a `bytes` stack of 2048 x 768 expert
// matrices: 16 matrices per dispatch (the gate and up of 8 active experts), drawn at random, for
// about `seconds`.
double measure_weights_gbps(ThreadPool& pool, size_t bytes = size_t(512) << 20, double seconds = 0.6);

// GB/s of Q4_K expert matrices (2048 x 768, from a `bytes` stack far larger than the caches)
// interleaved in place for the tile kernels (cpu/repack.h), each thread of the pool interleaving
// matrices of its own on its own thread, as the NVMe tier does each expert it reads: the rate of
// all of them together. Where the running kernels keep Q4_K in the file layout (AVX2), the same
// for the first of MXFP4, Q4_0, IQ4_NL they interleave; 0 where they interleave none of these.
// *measured (if given): the format timed.
double measure_interleave_gbps(ThreadPool& pool, size_t bytes = size_t(512) << 20, double seconds = 0.6,
                               GgmlType* measured = nullptr);

// GOP/s (2 per multiply-add) of Q4_K GEMMs: 2048 x 768 matrices times 64 activation rows, for about
// `seconds`.
double measure_gemm_gops(ThreadPool& pool, double seconds = 0.6);

}  // namespace strata::cpu
