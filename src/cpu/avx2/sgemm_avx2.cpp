// AVX2 + FMA float matrix product (kernels.h SgemmFn): C (+)= A B, row-major. Blocks of 4 rows of
// A by 16 columns of B (two registers): 8 accumulators. Column tails go through a zero-padded
// copy of the block's B columns and C cells; row tails use fewer rows.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cpu/avx2/simd_common.h"
#include "cpu/kernels.h"

namespace strata::cpu::detail {
namespace {

template <int MR>
void block16(int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc) {
  __m256 c0[MR], c1[MR];
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) {
    c0[r] = _mm256_loadu_ps(C + r * ldc);
    c1[r] = _mm256_loadu_ps(C + r * ldc + 8);
  }
  for (int64_t k = 0; k < K; ++k) {
    const __m256 b0 = _mm256_loadu_ps(B + k * ldb), b1 = _mm256_loadu_ps(B + k * ldb + 8);
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      const __m256 a = _mm256_broadcast_ss(A + r * lda + k);
      c0[r] = _mm256_fmadd_ps(a, b0, c0[r]);
      c1[r] = _mm256_fmadd_ps(a, b1, c1[r]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_ps(C + r * ldc, c0[r]);
    _mm256_storeu_ps(C + r * ldc + 8, c1[r]);
  }
}

using BlockFn = void (*)(int64_t, const float*, int64_t, const float*, int64_t, float*, int64_t);
constexpr BlockFn kBlocks[5] = {nullptr, block16<1>, block16<2>, block16<3>, block16<4>};

}  // namespace

void sgemm_avx2(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
                float* C, int64_t ldc, bool accumulate) {
  if (!accumulate)
    for (int64_t m = 0; m < M; ++m) std::memset(C + m * ldc, 0, size_t(N) * sizeof(float));
  for (int64_t n0 = 0; n0 < N; n0 += 16) {
    const int64_t w = N - n0 < 16 ? N - n0 : 16;
    for (int64_t m0 = 0; m0 < M; m0 += 4) {
      const int rows = int(M - m0 < 4 ? M - m0 : 4);
      if (w == 16) {
        kBlocks[rows](K, A + m0 * lda, lda, B + n0, ldb, C + m0 * ldc + n0, ldc);
        continue;
      }
      // ragged columns: a padded copy (16 wide) of this block's B columns and C cells
      thread_local float bpad[16 * 4096];
      alignas(32) float cpad[4 * 16] = {};
      for (int64_t k0 = 0; k0 < K; k0 += 4096) {
        const int64_t kk = K - k0 < 4096 ? K - k0 : 4096;
        for (int64_t k = 0; k < kk; ++k) {
          std::memset(bpad + k * 16, 0, 16 * sizeof(float));
          std::memcpy(bpad + k * 16, B + (k0 + k) * ldb + n0, size_t(w) * sizeof(float));
        }
        for (int r = 0; r < rows; ++r) std::memcpy(cpad + r * 16, C + (m0 + r) * ldc + n0, size_t(w) * sizeof(float));
        kBlocks[rows](kk, A + m0 * lda + k0, lda, bpad, 16, cpad, 16);
        for (int r = 0; r < rows; ++r) std::memcpy(C + (m0 + r) * ldc + n0, cpad + r * 16, size_t(w) * sizeof(float));
      }
    }
  }
}

}  // namespace strata::cpu::detail

// ---- exp for softmax ----

namespace strata::cpu::detail {
float exp_sum_avx2(const float* x, float* y, int64_t n, float max) {
  const __m256 m = _mm256_set1_ps(max);
  __m256 sum = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), m));
    _mm256_storeu_ps(y + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  float s = 0;
  for (float v : lanes) s += v;
  for (; i < n; ++i) {
    alignas(32) float in[8] = {x[i] - max}, out[8];
    _mm256_store_ps(out, exp8(_mm256_load_ps(in)));
    y[i] = out[0];
    s += out[0];
  }
  return s;
}

void axpy_avx2(float* y, const float* x, float a, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] = __builtin_fmaf(a, x[i], y[i]);  // not std::fma: an inline function of a shared header (simd_common.h)
}

void scale_avx2(float* y, const float* x, float a, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(av, _mm256_loadu_ps(x + i)));
  for (; i < n; ++i) y[i] = a * x[i];
}

void silu_mul_avx2(float* g, const float* u, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  auto silu_mul8 = [&](__m256 x, __m256 y) {
    return _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), x)))), y);
  };
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(g + i, silu_mul8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
  if (i < n) {
    alignas(32) float x[8] = {}, y[8] = {}, out[8];
    std::copy(g + i, g + n, x);
    std::copy(u + i, u + n, y);
    _mm256_store_ps(out, silu_mul8(_mm256_load_ps(x), _mm256_load_ps(y)));
    std::copy(out, out + (n - i), g + i);
  }
}

void half_to_float_avx2(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
  for (; i < n; ++i) y[i] = _cvtsh_ss(x[i]);
}

}  // namespace strata::cpu::detail
