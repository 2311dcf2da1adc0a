// AVX-512 float matrix product (kernels.h SgemmFn): C (+)= A B, row-major. Blocks of 8 rows of A
// by 32 columns of B (two registers) keep 16 accumulators in registers; each step of k loads two
// registers of B and broadcasts 8 values of A. With at most 8 rows, 128-column panels of 2 rows
// come first (whole 512-byte rows of B per step: decode attention's P V reads V in order). Column
// tails by masked loads and stores; row tails by the same loop with fewer rows. FMA in float: against the double-summed reference the result
// differs by float rounding of K-term sums (tests/test_simd_kernels.cpp states the bound).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdint>

#include "cpu/avx512/exp512.h"
#include "cpu/kernels.h"

namespace strata::cpu::detail {
namespace {

// MR rows of A by NV registers (16 NV columns) of B; masks apply to the last register only.
template <int MR, int NV>
void block(int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc,
           bool accumulate, __mmask16 last) {
  __m512 c[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = v == NV - 1 ? last : __mmask16(0xFFFF);
      c[r][v] = accumulate ? _mm512_maskz_loadu_ps(m, C + r * ldc + 16 * v) : _mm512_setzero_ps();
    }
  for (int64_t k = 0; k < K; ++k) {
    __m512 b[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v)
      b[v] = v == NV - 1 ? _mm512_maskz_loadu_ps(last, B + k * ldb + 16 * v) : _mm512_loadu_ps(B + k * ldb + 16 * v);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512 a = _mm512_set1_ps(A[r * lda + k]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) c[r][v] = _mm512_fmadd_ps(a, b[v], c[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v)
      _mm512_mask_storeu_ps(C + r * ldc + 16 * v, v == NV - 1 ? last : __mmask16(0xFFFF), c[r][v]);
}

using BlockFn = void (*)(int64_t, const float*, int64_t, const float*, int64_t, float*, int64_t, bool, __mmask16);
// 8 rows x 32 columns (most shapes); 2 rows x 128 columns for wide products with few rows (the
// P V of decode attention: each pass then reads whole 512-byte rows of V, in order).
constexpr BlockFn kNarrow[9] = {nullptr,      block<1, 2>, block<2, 2>, block<3, 2>, block<4, 2>,
                                block<5, 2>, block<6, 2>, block<7, 2>, block<8, 2>};
constexpr BlockFn kWide[3] = {nullptr, block<1, 8>, block<2, 8>};
constexpr BlockFn kOne[9] = {nullptr,      block<1, 1>, block<2, 1>, block<3, 1>, block<4, 1>,
                             block<5, 1>, block<6, 1>, block<7, 1>, block<8, 1>};

}  // namespace

void sgemm_avx512(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                  int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  int64_t n0 = 0;
  if (M <= 8)  // wide panels of 128 columns while they last
    for (; n0 + 128 <= N; n0 += 128)
      for (int64_t m0 = 0; m0 < M; m0 += 2) {
        const int rows = int(M - m0 < 2 ? M - m0 : 2);
        kWide[rows](K, A + m0 * lda, lda, B + n0, ldb, C + m0 * ldc + n0, ldc, accumulate, 0xFFFF);
      }
  for (; n0 < N; n0 += 32) {
    const int64_t w = N - n0 < 32 ? N - n0 : 32;
    if (w <= 16) {  // the last columns fit one register
      const __mmask16 m = _cvtu32_mask16(w >= 16 ? 0xFFFFu : (1u << w) - 1);
      for (int64_t m0 = 0; m0 < M; m0 += 8) {
        const int rows = int(M - m0 < 8 ? M - m0 : 8);
        kOne[rows](K, A + m0 * lda, lda, B + n0, ldb, C + m0 * ldc + n0, ldc, accumulate, m);
      }
      continue;
    }
    const __mmask16 last = _cvtu32_mask16(w >= 32 ? 0xFFFFu : (1u << (w - 16)) - 1);
    for (int64_t m0 = 0; m0 < M; m0 += 8) {
      const int rows = int(M - m0 < 8 ? M - m0 : 8);
      kNarrow[rows](K, A + m0 * lda, lda, B + n0, ldb, C + m0 * ldc + n0, ldc, accumulate, last);
    }
  }
}

}  // namespace strata::cpu::detail

// ---- exp for softmax (exp512.h) ----

namespace strata::cpu::detail {

float exp_sum_avx512(const float* x, float* y, int64_t n, float max) {
  const __m512 m = _mm512_set1_ps(max);
  __m512 sum = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), m));
    _mm512_storeu_ps(y + i, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (i < n) {
    const __mmask16 valid = _cvtu32_mask16((1u << (n - i)) - 1);
    const __m512 e = _mm512_maskz_mov_ps(valid, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(valid, x + i), m)));
    _mm512_mask_storeu_ps(y + i, valid, e);
    sum = _mm512_add_ps(sum, e);
  }
  return _mm512_reduce_add_ps(sum);
}

void silu_mul_avx512(float* g, const float* u, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
    const __m512 x = _mm512_maskz_loadu_ps(m, g + i);
    const __m512 s = _mm512_div_ps(x, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), x))));
    _mm512_mask_storeu_ps(g + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, u + i)));
  }
}

void axpy_avx512(float* y, const float* x, float a, int64_t n) {
  const __m512 av = _mm512_set1_ps(a);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
  }
}

void scale_avx512(float* y, const float* x, float a, int64_t n) {
  const __m512 av = _mm512_set1_ps(a);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_mul_ps(av, _mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(av, _mm512_maskz_loadu_ps(m, x + i)));
  }
}

void half_to_float_avx512(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i))));
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(y + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + i)));
  }
}

}  // namespace strata::cpu::detail
