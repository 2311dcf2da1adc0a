// Measurements of this machine's limits, the denominators of every "fraction of the limit" strata
// reports (strata bench, the kernel benchmarks): streaming DRAM read bandwidth and the int8
// dot-product peak of the CPU threads.
#pragma once

#include <cstddef>

#include "cpu/thread_pool.h"

namespace strata::cpu {

// Streaming read bandwidth in GB/s (1e9 B/s) with all threads of `pool`: each reads its share of
// a `bytes` buffer (far larger than any cache; allocated and first-touched by the threads that
// read it), best of `passes` passes. The buffer is freed on return.
double measure_read_gbps(ThreadPool& pool, size_t bytes = size_t(512) << 20, int passes = 5);

// The int8 multiply-accumulate peak of all threads of `pool` in GOP/s (one multiply-add = 2 ops):
// a register-only loop of independent vpdpbusd (AVX-512 VNNI) or vpmaddubsw + vpmaddwd (AVX2)
// on every thread, whichever the start-up kernel table uses; best of three runs of ~50 ms.
double measure_int8_peak_gops(ThreadPool& pool);

namespace detail {
// `iters` iterations of the ISA's register-only int8 loop; returns the int8 multiply-adds done.
double int8_loop_avx512(long iters);
double int8_loop_avx2(long iters);
}  // namespace detail

}  // namespace strata::cpu
