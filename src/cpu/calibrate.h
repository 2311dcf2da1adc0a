// Measurements of this machine's limits, the denominators of every "fraction of the limit" strata
// reports (strata bench, the kernel benchmarks): streaming DRAM read bandwidth and the int8 and
// bf16 dot-product peaks of the CPU threads. (Disk read bandwidth: storage/disk_probe.h.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "cpu/thread_pool.h"

namespace strata::cpu {

// Streaming read bandwidth in GB/s (1e9 B/s) with all threads of `pool`: each reads its share of
// a `bytes` buffer (far larger than any cache; allocated and first-touched by the threads that
// read it), best of `passes` passes. The buffer is freed on return.
double measure_read_gbps(ThreadPool& pool, size_t bytes = size_t(512) << 20, int passes = 5);

// The same probe with its buffer kept, for measurements repeated during a benchmark (no
// allocation or first touch per measurement).
class ReadProbe {
 public:
  ReadProbe(ThreadPool& pool, size_t bytes);
  ~ReadProbe();
  ReadProbe(const ReadProbe&) = delete;
  ReadProbe& operator=(const ReadProbe&) = delete;
  // GB/s, best of `passes` passes over the buffer.
  double measure(int passes = 1);

 private:
  ThreadPool& pool_;
  size_t n_ = 0;  // uint64 per thread
  std::vector<uint64_t*> parts_;
};

// The int8 multiply-accumulate peak of all threads of `pool` in GOP/s (one multiply-add = 2 ops):
// a register-only loop of independent vpdpbusd (AVX-512 VNNI) or vpmaddubsw + vpmaddwd (AVX2)
// on every thread, whichever the start-up kernel table uses; best of three runs of ~50 ms.
double measure_int8_peak_gops(ThreadPool& pool);

// The bf16 multiply-accumulate peak of all threads of `pool` in GFLOP/s (one multiply-add = 2
// flops): a register-only loop of independent vdpbf16ps (AVX512_BF16: 32 bf16 multiply-adds into
// 16 float lanes per instruction) on every thread; best of three runs of ~50 ms. Where AVX512_BF16
// is missing, or the start-up kernel table is below AVX-512 (STRATA_ISA), the float FMA peak
// instead (vfmadd231ps on zmm, or on ymm for AVX2); 0 on the scalar path. bf16_peak_method() says
// which was measured.
double measure_bf16_peak_gflops(ThreadPool& pool);

// What measure_bf16_peak_gflops measures on this CPU with the start-up kernel table:
// "bf16 vdpbf16ps zmm (AVX512_BF16)", "f32 vfmadd231ps zmm (no AVX512_BF16)",
// "f32 vfmadd231ps ymm (AVX2)" or "none (scalar kernels)".
std::string_view bf16_peak_method();

namespace detail {
// `iters` iterations of the ISA's register-only loop; each returns the multiply-adds done (int8,
// bf16 or float ones).
double int8_loop_avx512(long iters);
double int8_loop_avx2(long iters);
double bf16_loop_avx512(long iters);  // needs AVX512_BF16 (checked by the caller)
double f32_fma_loop_avx512(long iters);
double f32_fma_loop_avx2(long iters);
}  // namespace detail

}  // namespace strata::cpu
