// oneDNN's BF16 matmul (cpu/onednn_matmul.h), which Matmul::matmul uses for BF16 weights from
// kOnednnMinTokens tokens on: against the exact path (float activations, dequantized weights) on
// fresh random data. Tolerance: activations rounded to BF16 (relative 2^-9 each) plus float
// accumulation: |y - exact| <= 2^-8 sum_k |w_k x_k| per cell.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/onednn_matmul.h"
#include "cpu/ops.h"
#include "cpu/quant_traits.h"

namespace strata {
namespace {

TEST(Onednn, Bf16MatmulMatchesExactPath) {
  if (!cpu::onednn_available()) GTEST_SKIP() << "built without oneDNN (libdnnl-dev): the engine uses its own BF16 kernels";
  if (!cpu::onednn_bf16_supported())
    GTEST_SKIP() << "oneDNN refuses BF16 matmul on this CPU (no AVX-512): the engine uses its own BF16 kernels";
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  const int64_t K = 512, N = 96;
  const QuantTraits& bt = quant_traits(GgmlType::bf16);
  std::vector<uint8_t> wb(size_t(N * K) * 2);
  std::vector<float> wf(size_t(N * K));
  for (float& v : wf) v = nd(rng);
  bt.from_float(wf.data(), wb.data(), N * K);
  bt.dequantize_row(wb.data(), wf.data(), N * K);  // the values the weights really hold
  Weight w;
  w.data = wb.data();
  w.type = GgmlType::bf16;
  w.n_in = K;
  w.n_out = N;
  w.row_bytes = size_t(K) * 2;
  for (int64_t T : {cpu::kOnednnMinTokens, cpu::kOnednnMinTokens + 37}) {
    std::vector<float> x(size_t(T * K));
    for (float& v : x) v = nd(rng);
    std::vector<float> got(size_t(T * N), NAN), direct(size_t(T * N), NAN), exact(size_t(T * N));
    cpu::Matmul(cpu::MatmulPath::quantized).matmul(w, x.data(), T, got.data());
    cpu::Matmul(cpu::MatmulPath::exact).matmul(w, x.data(), T, exact.data());
    ASSERT_TRUE(cpu::onednn_matmul_bf16(w, x.data(), T, direct.data(), N));
    // the engine's matmul took the oneDNN path (same cells, bit for bit)
    EXPECT_EQ(std::memcmp(got.data(), direct.data(), got.size() * sizeof(float)), 0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t n = 0; n < N; ++n) {
        double m = 0;
        for (int64_t k = 0; k < K; ++k) m += std::fabs(double(wf[size_t(n * K + k)]) * x[size_t(t * K + k)]);
        const size_t c = size_t(t * N + n);
        ASSERT_LE(std::fabs(double(got[c]) - exact[c]), std::ldexp(m, -8) + 1e-6) << "t " << t << " n " << n;
      }
  }
  // other types and shapes are refused, nothing written
  Weight q = w;
  q.type = GgmlType::f16;
  std::vector<float> y(size_t(N), 7.0f), x(size_t(K), 1.0f);
  EXPECT_FALSE(cpu::onednn_matmul_bf16(q, x.data(), 1, y.data(), N));
  Weight wi = w;
  wi.interleaved = true;  // row-interleaved (cpu/repack.h): strata's own kernels read it
  EXPECT_FALSE(cpu::onednn_matmul_bf16(wi, x.data(), 1, y.data(), N));
  EXPECT_EQ(y[0], 7.0f);
}

}  // namespace
}  // namespace strata
