// Decode matrix-vector products per weight type and kernel variant (src/cpu/kernels.h), reading
// the weights from DRAM: each iteration multiplies the next matrix of a pool far larger than the
// caches (kPoolBytes), so no matrix is still cached when it comes round again. One iteration is
// what CpuBackend::matmul's quantized path does for one token (activations quantized once, rows
// split statically over all OpenMP threads), with the variant's table instead of the start-up one;
// BM_matmul_backend runs CpuBackend::matmul itself for comparison.
//
// Counters: GBps = weight bytes read per second of wall time (1e9 B/s); bw_frac = GBps / the
// streaming-read bandwidth of this machine with the same threads, measured just before each
// benchmark (dram_GBps: best of 5 passes over 512 MiB, read as bench_memory.cpp's BM_dram_read
// reads).
//
//   build/bench/strata_bench --benchmark_filter=matvec
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cpu/fp16.h"
#include "cpu/kernels.h"
#include "cpu/ops.h"
#include "cpu/quant_blocks.h"
#include "cpu/quant_traits.h"
#include "model/weights.h"

namespace strata {
namespace {

using cpu::CpuIsa;

constexpr size_t kPoolBytes = size_t(256) << 20;  // several times any L3 of a 2-core box

// ---- memory-bandwidth probe (as bench_memory.cpp: all threads stream a 512 MiB buffer) ----

// Best of five passes over 512 MiB. The machines this runs on are shared (and virtual): their
// bandwidth drifts by tens of percent within minutes, so every benchmark measures it again just
// before its timed loop, and bw_frac compares numbers taken seconds apart.
double measure_dram_gbps() {
  const size_t n = (size_t(512) << 20) / 8;
  static uint64_t* data = [n] {
    auto* d = static_cast<uint64_t*>(std::aligned_alloc(4096, n * 8));
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) d[i] = i * 0x9e3779b97f4a7c15ull;
    return d;
  }();
  double best = 0;
  uint64_t sink = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t sum = 0;
#pragma omp parallel for schedule(static) reduction(^ : sum)
    for (size_t i = 0; i < n; i += 8) {
      sum ^= data[i] + data[i + 1] + data[i + 2] + data[i + 3] + data[i + 4] + data[i + 5] +
             data[i + 6] + data[i + 7];
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    sink += sum;
    best = std::max(best, double(n * 8) / s / 1e9);
  }
  benchmark::DoNotOptimize(sink);
  return best;
}

// ---- weight pools ----

// A pool of random matrices of one type and shape, filled in parallel with the same static row
// split the matvec uses (first touch puts each page near the thread that reads it).
struct Pool {
  GgmlType type;
  int64_t n_in, n_out;
  size_t mat_bytes;
  int64_t count;
  uint8_t* data;
  Pool(GgmlType t, int64_t in, int64_t out) : type(t), n_in(in), n_out(out) {
    const QuantTraits& q = quant_traits(t);
    const size_t row_bytes = size_t(n_in) / q.block_size * q.type_size;
    mat_bytes = row_bytes * size_t(n_out);
    count = std::max<int64_t>(2, int64_t(kPoolBytes / mat_bytes));
    const size_t total = (mat_bytes * size_t(count) + 4095) / 4096 * 4096;
    data = static_cast<uint8_t*>(std::aligned_alloc(4096, total));
    const int64_t rows = n_out * count;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) fill_row(data + size_t(r) * row_bytes, row_bytes, uint64_t(r));
  }
  ~Pool() { std::free(data); }

  // random quant bytes, valid random scales (as tests/test_simd_kernels.cpp draws them)
  void fill_row(uint8_t* row, size_t bytes, uint64_t seed) const {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    auto next = [&s] {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      return s;
    };
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
      const uint64_t v = next();
      std::memcpy(row + i, &v, 8);
    }
    for (size_t i = bytes / 8 * 8; i < bytes; ++i) row[i] = uint8_t(next());
    if (type == GgmlType::f16 || type == GgmlType::bf16) {
      // random finite normal values, magnitudes in [2^-3, 2): f16 exponent field 12..15, bf16
      // 124..127
      const uint16_t keep = type == GgmlType::f16 ? 0x83FF : 0x807F;
      const uint16_t set = type == GgmlType::f16 ? 0x3000 : 0x3E00;
      const uint16_t random = type == GgmlType::f16 ? 0x0C00 : 0x0180;
      for (size_t i = 0; i + 2 <= bytes; i += 2) {
        uint16_t h;
        std::memcpy(&h, row + i, 2);
        h = uint16_t((h & (keep | random)) | set);
        std::memcpy(row + i, &h, 2);
      }
      return;
    }
    const QuantTraits& q = quant_traits(type);
    for (size_t b = 0; b < bytes / q.type_size; ++b) {
      uint8_t* blk = row + b * q.type_size;
      const uint16_t h = f32_to_fp16(std::ldexp(1.0f + float(next() % 1024) / 1024.0f, -8 - int(next() % 8)));
      switch (type) {
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
  Weight matrix(int64_t k) const {
    Weight w;
    w.data = data + size_t(k % count) * mat_bytes;
    w.type = type;
    w.n_in = n_in;
    w.n_out = n_out;
    w.row_bytes = mat_bytes / size_t(n_out);
    return w;
  }
};

// One pool alive at a time: benchmarks of the same type and shape are registered together.
const Pool& pool(GgmlType type, int64_t n_in, int64_t n_out) {
  static std::unique_ptr<Pool> p;
  if (!p || p->type != type || p->n_in != n_in || p->n_out != n_out) {
    p.reset();
    p = std::make_unique<Pool>(type, n_in, n_out);
  }
  return *p;
}

std::vector<float> activations(int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  uint64_t s = 12345;
  for (float& v : x) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    v = float(int64_t(s >> 40) - (1 << 23)) / float(1 << 23);
  }
  return x;
}

// The counters from the bytes read and the wall time of the timed loop (measured here, so that
// they are plain numbers, not Google Benchmark's per-second rates).
void set_counters(benchmark::State& state, size_t bytes_per_iter, double seconds, double dram_gbps) {
  const double gbps = double(bytes_per_iter) * double(state.iterations()) / seconds / 1e9;
  state.counters["GBps"] = gbps;
  state.counters["bw_frac"] = gbps / dram_gbps;
  state.counters["dram_GBps"] = dram_gbps;
  state.counters["threads"] = omp_get_max_threads();
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// y = W x with the kernels of one ISA, as matmul_quantized does it.
void BM_matvec(benchmark::State& state, GgmlType type, CpuIsa isa, int64_t n_in, int64_t n_out) {
  if (!cpu::isa_supported(isa)) {
    state.SkipWithError("this CPU lacks the ISA");
    return;
  }
  const Pool& p = pool(type, n_in, n_out);
  const double dram = measure_dram_gbps();
  const cpu::KernelTable& k = cpu::cpu_kernels(isa);
  const QuantTraits& qt = quant_traits(type);
  const VecDotFn vec_dot = k.dot(type);
  // null for f16 / bf16, whose activations stay float
  const QuantizeRowFn quantize = k.quantize(qt.vec_dot_type);
  const std::vector<float> x = activations(n_in);
  std::vector<uint8_t> xq(ggml_row_bytes(qt.vec_dot_type, uint64_t(n_in)));
  std::vector<float> y(static_cast<size_t>(n_out));
  int64_t next = 0;
  const double t0 = now_seconds();
  for (auto _ : state) {
    const Weight w = p.matrix(next++);
    const void* a = x.data();
    if (quantize) {
      quantize(x.data(), xq.data(), n_in);
      a = xq.data();
    }
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n_out; ++r) y[size_t(r)] = vec_dot(n_in, w.row(r), a);
    benchmark::DoNotOptimize(y.data());
  }
  set_counters(state, p.mat_bytes, now_seconds() - t0, dram);
  state.SetLabel(std::string(qt.name) + " " + std::string(cpu::isa_name(isa)));
}

// The same through CpuBackend::matmul (quantized path, the start-up ISA).
void BM_matmul_backend(benchmark::State& state, GgmlType type, int64_t n_in, int64_t n_out) {
  const Pool& p = pool(type, n_in, n_out);
  const double dram = measure_dram_gbps();
  const cpu::CpuBackend backend(cpu::MatmulPath::quantized);
  const std::vector<float> x = activations(n_in);
  std::vector<float> y(static_cast<size_t>(n_out));
  int64_t next = 0;
  const double t0 = now_seconds();
  for (auto _ : state) {
    backend.matmul(p.matrix(next++), x.data(), 1, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  set_counters(state, p.mat_bytes, now_seconds() - t0, dram);
  state.SetLabel(std::string(quant_traits(type).name) + " " + std::string(cpu::isa_name()));
}

struct Shape {
  int64_t n_in, n_out;
  const char* name;
};

// Same list as tests/test_simd_kernels.cpp kSimdTypes.
const GgmlType kTypes[] = {GgmlType::q4_k, GgmlType::q5_k, GgmlType::q6_k,  GgmlType::q8_0,
                           GgmlType::q4_0, GgmlType::q5_0, GgmlType::mxfp4, GgmlType::iq4_nl,
                           GgmlType::f16,  GgmlType::bf16};
const Shape kShapes[] = {{4096, 4096, "4096x4096"},
                         {2048, 768, "expert_2048in_768out"},
                         {768, 2048, "expert_768in_2048out"}};

const int kRegistered = [] {
  for (GgmlType type : kTypes) {
    const std::string tname(quant_traits(type).name);
    for (const Shape& s : kShapes) {
      for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512}) {
        const std::string name = "BM_matvec/" + tname + "/" + std::string(cpu::isa_name(isa)) + "/" + s.name;
        benchmark::RegisterBenchmark(name.c_str(), BM_matvec, type, isa, s.n_in, s.n_out)
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime()
            ->MinTime(isa == CpuIsa::scalar ? 0.3 : 1.0);
      }
      const std::string name = "BM_matmul_backend/" + tname + "/" + s.name;
      benchmark::RegisterBenchmark(name.c_str(), BM_matmul_backend, type, s.n_in, s.n_out)
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime()
          ->MinTime(1.0);
    }
  }
  return 0;
}();

}  // namespace
}  // namespace strata
