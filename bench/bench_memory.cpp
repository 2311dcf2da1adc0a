// Memory read bandwidth of this machine: the denominator every CPU kernel figure is reported
// against ("fraction of measured DRAM bandwidth"). cpu::measure_read_gbps: every thread of the
// compute pool streams its own part of a buffer far larger than the caches (best of 5 passes).
//
//   build/bench/strata_bench_kernels --benchmark_filter=dram
#include <benchmark/benchmark.h>

#include "bench/bench_common.h"

namespace strata::bench {
namespace {

void BM_dram_read(benchmark::State& state) {
  const size_t bytes = size_t(state.range(0)) << 20;
  double best = 0;
  for (auto _ : state) best = std::max(best, cpu::measure_read_gbps(cpu::compute_pool(), bytes));
  state.counters["GBps"] = best;
  state.counters["threads"] = cpu::compute_pool().size();
}
BENCHMARK(BM_dram_read)->Arg(512)->Arg(2048)->Iterations(3)->Unit(benchmark::kMillisecond);

// The int8 dot-product peak (the denominator of prefill figures).
void BM_int8_peak(benchmark::State& state) {
  double best = 0;
  for (auto _ : state) best = std::max(best, cpu::measure_int8_peak_gops(cpu::compute_pool()));
  state.counters["GOPs"] = best;
  state.counters["threads"] = cpu::compute_pool().size();
}
BENCHMARK(BM_int8_peak)->Iterations(3)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace strata::bench
