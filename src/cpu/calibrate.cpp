#include "cpu/calibrate.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "base/error.h"
#include "cpu/kernels.h"

namespace strata::cpu {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Sums a range with eight independent accumulators (the compiler vectorises the loop; the sum keeps
// the reads from being optimised away).
uint64_t sum_range(const uint64_t* p, size_t n) {
  uint64_t s[8] = {};
  for (size_t i = 0; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += p[i + size_t(j)];
  return s[0] ^ s[1] ^ s[2] ^ s[3] ^ s[4] ^ s[5] ^ s[6] ^ s[7];
}

// Runs fn(i) for i < pool.size() with each i on its own thread: a task waits until every task has
// started, so no thread can take two (the pool hands tasks out dynamically, and a fast caller would
// otherwise run all of them itself and the probe would measure one thread).
template <class Fn>
void on_every_thread(ThreadPool& pool, Fn&& fn) {
  std::atomic<int> started{0};
  const int n = pool.size();
  pool.run(n, [&](int64_t i, int) {
    started.fetch_add(1);
    while (started.load() < n) {
    }
    fn(i);
  });
}

}  // namespace

ReadProbe::ReadProbe(ThreadPool& pool, size_t bytes) : pool_(pool) {
  const int n_threads = pool.size();
  n_ = bytes / sizeof(uint64_t) / size_t(n_threads) / 64 * 64;  // per thread
  STRATA_CHECK(n_ > 0, "bandwidth probe buffer too small");
  parts_.assign(size_t(n_threads), nullptr);
  on_every_thread(pool, [&](int64_t i) {
    auto* p = static_cast<uint64_t*>(std::aligned_alloc(4096, n_ * sizeof(uint64_t)));
    STRATA_CHECK(p != nullptr, "out of memory for the bandwidth probe");
    for (size_t j = 0; j < n_; ++j) p[j] = j * 0x9e3779b97f4a7c15ull;
    parts_[size_t(i)] = p;
  });
}

ReadProbe::~ReadProbe() {
  for (uint64_t* p : parts_) std::free(p);
}

double ReadProbe::measure(int passes) {
  std::atomic<uint64_t> sink{0};
  double best = 0;
  for (int pass = 0; pass < passes; ++pass) {
    const auto t0 = Clock::now();
    // every thread reads its own part (first-touched by it)
    on_every_thread(pool_, [&](int64_t i) { sink ^= sum_range(parts_[size_t(i)], n_); });
    best = std::max(best, double(n_ * sizeof(uint64_t) * parts_.size()) / seconds_since(t0) / 1e9);
  }
  if (sink.load() == 42) std::abort();  // practically never; keeps the sums alive
  return best;
}

double measure_read_gbps(ThreadPool& pool, size_t bytes, int passes) {
  return ReadProbe(pool, bytes).measure(passes);
}

namespace {

// The multiply-adds per second of `loop` (a register-only probe: long iters -> multiply-adds done)
// on all threads of `pool` together: the run sized to ~50 ms on one thread, best of three runs.
template <class Loop>
double peak_multiply_adds_per_second(ThreadPool& pool, Loop loop) {
  // size the run to ~50 ms on one thread
  long iters = 1 << 16;
  for (;;) {
    const auto t0 = Clock::now();
    loop(iters);
    if (seconds_since(t0) > 0.01 || iters > (1L << 30)) break;
    iters *= 4;
  }
  const double t_one = [&] {
    const auto t0 = Clock::now();
    loop(iters);
    return seconds_since(t0);
  }();
  iters = std::max(1L, long(double(iters) * 0.05 / t_one));
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    std::atomic<double> macs{0};
    const auto t0 = Clock::now();
    on_every_thread(pool, [&](int64_t) {
      const double m = loop(iters);
      double cur = macs.load();
      while (!macs.compare_exchange_weak(cur, cur + m)) {
      }
    });
    best = std::max(best, macs.load() / seconds_since(t0));
  }
  return best;
}

enum class FloatPeakLoop { none, bf16_avx512, f32_avx512, f32_avx2 };

// The loop the bf16 probe runs here: what the start-up kernel table allows, and vdpbf16ps only
// where cpuid says AVX512_BF16.
FloatPeakLoop float_peak_loop() {
  switch (cpu_kernels().isa) {
    case CpuIsa::scalar:
      return FloatPeakLoop::none;
    case CpuIsa::avx2:
      return FloatPeakLoop::f32_avx2;
    case CpuIsa::avx512:
#if STRATA_X86_KERNELS
      return __builtin_cpu_supports("avx512bf16") ? FloatPeakLoop::bf16_avx512 : FloatPeakLoop::f32_avx512;
#else
      return FloatPeakLoop::f32_avx512;
#endif
  }
  return FloatPeakLoop::none;
}

}  // namespace

double measure_int8_peak_gops(ThreadPool& pool) {
  const CpuIsa isa = cpu_kernels().isa;
  if (isa == CpuIsa::scalar) return 0;
  auto loop = [isa](long iters) {
#if STRATA_X86_KERNELS
    return isa == CpuIsa::avx512 ? detail::int8_loop_avx512(iters) : detail::int8_loop_avx2(iters);
#else
    (void)isa;
    (void)iters;
    return 0.0;
#endif
  };
  return 2.0 * peak_multiply_adds_per_second(pool, loop) / 1e9;
}

double measure_bf16_peak_gflops(ThreadPool& pool) {
  const FloatPeakLoop kind = float_peak_loop();
  if (kind == FloatPeakLoop::none) return 0;
  auto loop = [kind](long iters) {
#if STRATA_X86_KERNELS
    switch (kind) {
      case FloatPeakLoop::bf16_avx512: return detail::bf16_loop_avx512(iters);
      case FloatPeakLoop::f32_avx512: return detail::f32_fma_loop_avx512(iters);
      case FloatPeakLoop::f32_avx2: return detail::f32_fma_loop_avx2(iters);
      case FloatPeakLoop::none: break;
    }
#else
    (void)kind;
    (void)iters;
#endif
    return 0.0;
  };
  return 2.0 * peak_multiply_adds_per_second(pool, loop) / 1e9;
}

std::string_view bf16_peak_method() {
  switch (float_peak_loop()) {
    case FloatPeakLoop::bf16_avx512: return "bf16 vdpbf16ps zmm (AVX512_BF16)";
    case FloatPeakLoop::f32_avx512: return "f32 vfmadd231ps zmm (no AVX512_BF16)";
    case FloatPeakLoop::f32_avx2: return "f32 vfmadd231ps ymm (AVX2)";
    case FloatPeakLoop::none: break;
  }
  return "none (scalar kernels)";
}

}  // namespace strata::cpu
