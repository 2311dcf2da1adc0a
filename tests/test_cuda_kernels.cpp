// The CUDA kernels (gpu/cuda_kernels.h) against the CPU reference, per format, on fresh random
// data: every row of a matrix-vector product within 1e-5 of sum |w x| (float accumulation in
// another order). Skips, saying so, where no CUDA device is usable (every CPU-only machine: run
// scripts/gpu-check.sh on a GPU host); builds without CUDA check that they say so.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/fp16.h"
#include "cpu/quant_traits.h"
#include "gpu/cuda_kernels.h"
#include "gpu/gpu_devices.h"

namespace strata {
namespace {

TEST(CudaKernels, MatvecMatchesTheCpuReferencePerFormat) {
  if (!gpu::cuda_usable()) {
    const GpuDevices d = list_gpu_devices();
    if (!d.built_with_cuda) {
      std::vector<float> y(1);
      const float x = 1;
      const uint8_t w[4] = {};
      const Status st = gpu::cuda_matvec(GgmlType::f32, w, 1, 1, 4, &x, y.data());
      ASSERT_FALSE(st.ok());
      EXPECT_NE(st.error().message.find("without the CUDA library"), std::string::npos);
    }
    GTEST_SKIP() << "no usable CUDA device (" << (d.error.empty() ? "not built with CUDA" : d.error)
                 << "): the kernels are checked by scripts/gpu-check.sh on a GPU host";
  }
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  const int64_t rows = 37, cols = 1024;
  for (GgmlType type : {GgmlType::f32, GgmlType::bf16, GgmlType::q8_0, GgmlType::q4_k, GgmlType::mxfp4}) {
    SCOPED_TRACE(std::string(ggml_type_name(type)));
    const QuantTraits& t = quant_traits(type);
    const size_t row_bytes = ggml_row_bytes(type, cols);
    std::vector<uint8_t> w(size_t(rows) * row_bytes);
    std::vector<float> wf(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      uint8_t* row = &w[size_t(r) * row_bytes];
      if (type == GgmlType::mxfp4) {  // no quantizer: random blocks with sane exponents
        for (size_t b = 0; b < row_bytes; b += 17) {
          row[b] = uint8_t(120 + rng() % 12);
          for (int i = 1; i < 17; ++i) row[b + size_t(i)] = uint8_t(rng());
        }
      } else if (t.from_float == nullptr) {  // Q4_K (no quantizer): random blocks, small finite d and dmin
        ASSERT_EQ(type, GgmlType::q4_k);
        for (size_t b = 0; b < row_bytes; b += 144) {
          for (int i = 4; i < 144; ++i) row[b + size_t(i)] = uint8_t(rng());
          const uint16_t d = f32_to_fp16(0.002f + 0.01f * float(rng() % 100) / 100), dmin = f32_to_fp16(0.004f);
          std::memcpy(row + b, &d, 2);
          std::memcpy(row + b + 2, &dmin, 2);
        }
      } else {
        for (float& v : wf) v = nd(rng);
        t.from_float(wf.data(), row, cols);
      }
    }
    std::vector<float> x(static_cast<size_t>(cols));
    for (float& v : x) v = nd(rng);
    std::vector<float> y(size_t(rows), NAN);
    const Status st = gpu::cuda_matvec(type, w.data(), rows, cols, row_bytes, x.data(), y.data());
    ASSERT_TRUE(st.ok()) << st.error().message;
    for (int64_t r = 0; r < rows; ++r) {
      t.dequantize_row(&w[size_t(r) * row_bytes], wf.data(), cols);  // the values the weights hold
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < cols; ++k) {
        ref += double(wf[size_t(k)]) * x[size_t(k)];
        mag += std::fabs(double(wf[size_t(k)]) * x[size_t(k)]);
      }
      EXPECT_NEAR(y[size_t(r)], ref, 1e-5 * mag + 1e-6) << "row " << r;
    }
  }
}

}  // namespace
}  // namespace strata
