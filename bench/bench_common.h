// What the benchmark files share: random weights far larger than the caches, activations, the
// machine's measured limits and the counters every figure is reported with (STYLE.md 12).
#pragma once

#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cpu/calibrate.h"
#include "cpu/fp16.h"
#include "cpu/quant_blocks.h"
#include "cpu/quant_traits.h"
#include "cpu/repack.h"
#include "cpu/thread_pool.h"
#include "cpu/weights.h"

namespace strata::bench {

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The int8 peak of the pool's threads (measured once per process).
inline double int8_peak_gops() {
  static const double peak = cpu::measure_int8_peak_gops(cpu::compute_pool());
  return peak;
}

// The DRAM probe taken all along a timed loop: one pass over a 256 MiB buffer (~5 ms) before the
// loop and then after every ~50 ms of kernel time, with the benchmark's timer paused. On a shared
// VM whose bandwidth drifts by tens of percent within seconds, the mean of probes interleaved with
// the kernel is a steadier denominator than one probe before it. Call tick() once per iteration.
class DramTracker {
 public:
  explicit DramTracker(benchmark::State& state) : state_(state) {
    probe();
    mark_ = now_seconds();
  }
  void tick() {
    const double t = now_seconds();
    busy_ += t - mark_;
    mark_ = t;
    if (busy_ - busy_at_probe_ >= 0.05) {
      state_.PauseTiming();
      probe();
      state_.ResumeTiming();
      busy_at_probe_ = busy_;
      mark_ = now_seconds();
    }
  }
  double kernel_seconds() const { return busy_; }
  double mean_gbps() const { return n_ ? sum_ / n_ : 0.0; }

 private:
  void probe() {
    static cpu::ReadProbe p(cpu::compute_pool(), size_t(256) << 20);
    sum_ += p.measure(1);
    ++n_;
  }
  benchmark::State& state_;
  double mark_ = 0, busy_ = 0, busy_at_probe_ = 0, sum_ = 0;
  int n_ = 0;
};

// GBps = bytes read per second of the timed loop; bw_frac = that / the DRAM probe (DramTracker).
inline void set_bandwidth_counters(benchmark::State& state, size_t bytes_per_iter, double seconds,
                                   double dram) {
  const double gbps = double(bytes_per_iter) * double(state.iterations()) / seconds / 1e9;
  state.counters["GBps"] = gbps;
  state.counters["bw_frac"] = gbps / dram;
  state.counters["dram_GBps"] = dram;
  state.counters["threads"] = cpu::compute_pool().size();
}

// Deterministic activations in [-1, 1).
inline std::vector<float> activations(int64_t n, uint64_t seed) {
  std::vector<float> x(static_cast<size_t>(n));
  uint64_t s = 12345 + seed * 0x9E3779B97F4A7C15ull;
  for (float& v : x) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    v = float(int64_t(s >> 40) - (1 << 23)) / float(1 << 23);
  }
  return x;
}

// n_mat random matrices [n_out][n_in] of one type, stacked as a model file stacks experts: random
// quant bytes with valid random scales (as tests/test_simd_kernels.cpp draws them), random finite
// values for the float types. Filled by the pool's threads (first touch places the pages).
class RandomWeights {
 public:
  // repack: rewritten as the loader rewrites weights read into RAM (cpu/repack.h), so that
  // stack() is what the engine's kernels read; false keeps the file layout.
  RandomWeights(GgmlType type, int64_t n_in, int64_t n_out, int64_t n_mat, uint64_t seed, bool repack = true)
      : type_(type), n_in_(n_in), n_out_(n_out), n_mat_(n_mat) {
    const QuantTraits& q = quant_traits(type);
    row_bytes_ = size_t(n_in) / q.block_size * q.type_size;
    const size_t total = (row_bytes_ * size_t(n_out * n_mat) + 4095) / 4096 * 4096;
    data_ = static_cast<uint8_t*>(std::aligned_alloc(4096, total));
    // huge pages where the kernel allows, as the loader asks for (4 KiB pages cost TLB misses)
    madvise(data_, total, MADV_HUGEPAGE);
    cpu::compute_pool().run(n_out * n_mat, [&](int64_t r, int) {
      fill_row(data_ + size_t(r) * row_bytes_, seed * 1000003u + uint64_t(r));
    });
    Weight w = stack();
    if (repack && cpu::can_interleave(w)) {
      cpu::interleave(w, data_);
      interleaved_ = true;
    }
  }
  ~RandomWeights() { std::free(data_); }
  RandomWeights(const RandomWeights&) = delete;
  RandomWeights& operator=(const RandomWeights&) = delete;

  Weight stack() const {
    Weight w;
    w.data = data_;
    w.type = type_;
    w.n_in = n_in_;
    w.n_out = n_out_;
    w.n_mat = n_mat_;
    w.row_bytes = row_bytes_;
    w.interleaved = interleaved_;
    return w;
  }
  size_t mat_bytes() const { return row_bytes_ * size_t(n_out_); }

 private:
  void fill_row(uint8_t* row, uint64_t seed) const {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    auto next = [&s] {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      return s;
    };
    const QuantTraits& q = quant_traits(type_);
    if (type_ == GgmlType::f32 || type_ == GgmlType::f16 || type_ == GgmlType::bf16) {
      std::vector<float> v(static_cast<size_t>(n_in_));
      for (float& x : v) x = float(int64_t(next() >> 40) - (1 << 23)) / float(1 << 23);
      q.from_float(v.data(), row, n_in_);
      return;
    }
    for (size_t i = 0; i + 8 <= row_bytes_; i += 8) {
      const uint64_t v = next();
      std::memcpy(row + i, &v, 8);
    }
    for (size_t i = row_bytes_ / 8 * 8; i < row_bytes_; ++i) row[i] = uint8_t(next());
    for (size_t b = 0; b < row_bytes_ / q.type_size; ++b) {
      uint8_t* blk = row + b * q.type_size;
      const uint16_t h = f32_to_fp16(std::ldexp(1.0f + float(next() % 1024) / 1024.0f, -8 - int(next() % 8)));
      switch (type_) {
        case GgmlType::mxfp4: blk[0] = uint8_t(118 + next() % 8); break;
        case GgmlType::q6_k: std::memcpy(blk + offsetof(block_q6_K, d), &h, 2); break;
        case GgmlType::q4_k:
        case GgmlType::q5_k:
          std::memcpy(blk, &h, 2);
          std::memcpy(blk + 2, &h, 2);
          break;
        default: std::memcpy(blk, &h, 2); break;  // d first: q4_0, q5_0, q8_0, iq4_nl
      }
    }
  }

  GgmlType type_;
  int64_t n_in_, n_out_, n_mat_;
  size_t row_bytes_ = 0;
  uint8_t* data_ = nullptr;
  bool interleaved_ = false;
};

}  // namespace strata::bench
