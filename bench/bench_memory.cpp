// Memory read bandwidth of this machine: the denominator every CPU kernel figure is reported
// against ("fraction of measured DRAM bandwidth"). Streams a buffer far larger than the caches
// with all OpenMP threads, each reading its own contiguous part.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace {

struct Buffer {
  uint64_t* data;
  size_t n;  // elements
  explicit Buffer(size_t bytes) : n(bytes / 8) {
    data = static_cast<uint64_t*>(std::aligned_alloc(4096, n * 8));
    // touch every page from the threads that will read it (first touch places pages)
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) data[i] = i * 0x9e3779b97f4a7c15ull;
  }
  ~Buffer() { std::free(data); }
};

void BM_dram_read(benchmark::State& state) {
  const size_t bytes = size_t(state.range(0)) << 20;
  static std::unique_ptr<Buffer> buf;
  if (!buf || buf->n * 8 != bytes) buf = std::make_unique<Buffer>(bytes);
  uint64_t total = 0;
  for (auto _ : state) {
    uint64_t sum = 0;
#pragma omp parallel for schedule(static) reduction(^ : sum)
    for (size_t i = 0; i < buf->n; i += 8) {
      // 8 independent lanes per 64-byte line keep enough loads in flight
      sum ^= buf->data[i] + buf->data[i + 1] + buf->data[i + 2] + buf->data[i + 3] +
             buf->data[i + 4] + buf->data[i + 5] + buf->data[i + 6] + buf->data[i + 7];
    }
    total += sum;
    benchmark::DoNotOptimize(total);
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(bytes));
  state.counters["threads"] = omp_get_max_threads();
}
BENCHMARK(BM_dram_read)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);

}  // namespace
