// Decode matrix-vector products per weight type and kernel variant (src/cpu/kernels.h), reading
// the weights from DRAM: each iteration multiplies the next matrix of a stack far larger than the
// caches (kStackBytes), so no matrix is still cached when it comes round again. One iteration is
// what Matmul::matmul does for one token (activations quantized once, row chunks as tasks of
// the compute pool) with the variant's table instead of the start-up one; BM_matmul_backend runs
// Matmul::matmul itself.
//
// Counters (bench_common.h): GBps = weight bytes read per second; bw_frac = GBps / the mean of
// DRAM read probes taken along the timed loop with the same threads (DramTracker).
//
//   build/bench/strata_bench_kernels --benchmark_filter=matvec
#include <benchmark/benchmark.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "cpu/kernels.h"
#include "cpu/ops.h"
#include "cpu/quant_traits.h"
#include "cpu/thread_pool.h"

namespace strata::bench {
namespace {

using cpu::CpuIsa;

constexpr size_t kStackBytes = size_t(256) << 20;  // several times any L3 of a 2-core box

// One stack alive at a time: benchmarks of the same type and shape are registered together.
// repack: the engine's layout (cpu/repack.h) where the start-up kernels have one.
const RandomWeights& stack_of(GgmlType type, int64_t n_in, int64_t n_out, bool repack, int64_t* count) {
  static std::unique_ptr<RandomWeights> w;
  static GgmlType t = GgmlType::f32;
  static int64_t in = 0, out = 0, n = 0;
  static bool packed = false;
  if (!w || t != type || in != n_in || out != n_out || packed != repack) {
    w.reset();
    const size_t mat = ggml_row_bytes(type, uint64_t(n_in)) * size_t(n_out);
    n = std::max<int64_t>(2, int64_t(kStackBytes / mat));
    w = std::make_unique<RandomWeights>(type, n_in, n_out, n, 17, repack);
    t = type, in = n_in, out = n_out, packed = repack;
  }
  *count = n;
  return *w;
}

void BM_matvec(benchmark::State& state, GgmlType type, CpuIsa isa, int64_t n_in, int64_t n_out) {
  if (!cpu::isa_supported(isa)) {
    state.SkipWithError("this CPU lacks the ISA");
    return;
  }
  int64_t count = 0;
  const RandomWeights& w = stack_of(type, n_in, n_out, false, &count);
  const cpu::KernelTable& k = cpu::cpu_kernels(isa);
  const QuantTraits& qt = quant_traits(type);
  const std::vector<float> x = activations(n_in, 1);
  const bool quantized = qt.vec_dot_type != GgmlType::f32;
  std::vector<uint8_t> xq(quantized ? ggml_row_bytes(qt.vec_dot_type, uint64_t(n_in)) : 0);
  std::vector<float> y(static_cast<size_t>(n_out));
  cpu::ThreadPool& pool = cpu::compute_pool();
  // the engine's decode tasks (Matmul::matmul_batch): guided row counts
  std::vector<int64_t> starts{0};
  for (int64_t n : cpu::Matmul::guided_rows(n_out, pool.size(), cpu::Matmul::min_task_rows(w.stack().row_bytes)))
    starts.push_back(starts.back() + n);
  const int64_t n_tasks = int64_t(starts.size()) - 1;
  const Weight stack = w.stack();
  int64_t next = 0;
  DramTracker dram(state);
  for (auto _ : state) {
    const Weight m = stack.slice(next++ % count);
    if (quantized) k.quantize(qt.vec_dot_type)(x.data(), xq.data(), n_in);
    const void* a = quantized ? static_cast<const void*>(xq.data()) : x.data();
    pool.run(n_tasks, [&](int64_t task, int) {
      const int64_t r0 = starts[size_t(task)], r1 = starts[size_t(task) + 1];
      k.gemm_tile(type, n_in, m.row(r0), m.row_bytes, r1 - r0, a, 0, 1, y.data() + r0, n_out);
    });
    benchmark::DoNotOptimize(y.data());
    dram.tick();
  }
  set_bandwidth_counters(state, w.mat_bytes(), dram.kernel_seconds(), dram.mean_gbps());
  state.SetLabel(std::string(qt.name) + " " + std::string(cpu::isa_name(isa)));
}

// n_tok > 1: a few tokens at once (speculative verification): the weights are still read once,
// so the bandwidth counters say how close the step stays to a one-token read.
void BM_matmul_backend(benchmark::State& state, GgmlType type, int64_t n_in, int64_t n_out, int64_t n_tok) {
  int64_t count = 0;
  const RandomWeights& w = stack_of(type, n_in, n_out, true, &count);
  const cpu::Matmul backend(cpu::MatmulPath::quantized);
  const std::vector<float> x = activations(n_in * n_tok, 1);
  std::vector<float> y(static_cast<size_t>(n_out * n_tok));
  const Weight stack = w.stack();
  int64_t next = 0;
  DramTracker dram(state);
  for (auto _ : state) {
    backend.matmul(stack.slice(next++ % count), x.data(), n_tok, y.data());
    benchmark::DoNotOptimize(y.data());
    dram.tick();
  }
  set_bandwidth_counters(state, w.mat_bytes(), dram.kernel_seconds(), dram.mean_gbps());
  state.SetLabel(std::string(quant_traits(type).name) + " " + std::string(cpu::isa_name()) +
                 (stack.interleaved ? " interleaved" : ""));
}

struct Shape {
  int64_t n_in, n_out;
  const char* name;
};

// Same list as tests/test_simd_kernels.cpp kSimdTypes (+ f32).
const GgmlType kTypes[] = {GgmlType::q4_k, GgmlType::q5_k, GgmlType::q6_k, GgmlType::q8_0,
                           GgmlType::q4_0, GgmlType::q5_0, GgmlType::mxfp4, GgmlType::iq4_nl,
                           GgmlType::f16,  GgmlType::bf16, GgmlType::f32};
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
      benchmark::RegisterBenchmark(name.c_str(), BM_matmul_backend, type, s.n_in, s.n_out, int64_t(1))
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime()
          ->MinTime(1.0);
      if (type != GgmlType::q4_k && type != GgmlType::q6_k && type != GgmlType::q8_0) continue;
      for (int64_t n_tok : {2, 4, 5, 8, 9}) {
        benchmark::RegisterBenchmark((name + "/tokens:" + std::to_string(n_tok)).c_str(), BM_matmul_backend, type,
                                     s.n_in, s.n_out, n_tok)
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime()
            ->MinTime(1.0);
      }
    }
  }
  // a MoE router (qwen3-30b-a3b: 2048 -> 128 experts, f32): one small matrix per layer and token
  benchmark::RegisterBenchmark("BM_matmul_backend/f32/router_2048in_128out", BM_matmul_backend, GgmlType::f32,
                               int64_t(2048), int64_t(128), int64_t(1))
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime()
      ->MinTime(1.0);
  return 0;
}();

}  // namespace
}  // namespace strata::bench
