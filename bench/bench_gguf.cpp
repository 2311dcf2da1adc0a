// Opening and validating a GGUF: what start-up pays before the first token.
#include <benchmark/benchmark.h>

#include <string>

#include "model/gguf.h"

namespace {

void BM_gguf_open_vendored(benchmark::State& state) {
  const std::string path =
      std::string(STRATA_SOURCE_DIR) + "/tests/data/models/qwen3moe/model-Q4_K_M.gguf";
  for (auto _ : state) {
    auto f = strata::GgufFile::open(path);
    if (!f.ok()) {
      state.SkipWithError(f.error().message.c_str());
      return;
    }
    benchmark::DoNotOptimize(f->tensors().size());
  }
}
BENCHMARK(BM_gguf_open_vendored)->Unit(benchmark::kMicrosecond);

}  // namespace
