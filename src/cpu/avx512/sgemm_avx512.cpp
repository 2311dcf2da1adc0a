// AVX-512 float matrix product (kernels.h SgemmFn): C (+)= A B, row-major. Blocks of 8 rows of A
// by 32 columns of B (two registers) keep 16 accumulators in registers; each step of k loads two
// registers of B and broadcasts 8 values of A. Column tails by masked loads and stores; row tails
// by the same loop with fewer rows. FMA in float: against the double-summed reference the result
// differs by float rounding of K-term sums (tests/test_simd_kernels.cpp states the bound).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdint>

#include "cpu/kernels.h"

namespace strata::cpu::detail {
namespace {

template <int MR>
void block(int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc,
           bool accumulate, __mmask16 m0, __mmask16 m1) {
  __m512 c0[MR], c1[MR];
  for (int r = 0; r < MR; ++r) {
    c0[r] = accumulate ? _mm512_maskz_loadu_ps(m0, C + r * ldc) : _mm512_setzero_ps();
    c1[r] = accumulate ? _mm512_maskz_loadu_ps(m1, C + r * ldc + 16) : _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < K; ++k) {
    const __m512 b0 = _mm512_maskz_loadu_ps(m0, B + k * ldb);
    const __m512 b1 = _mm512_maskz_loadu_ps(m1, B + k * ldb + 16);
    for (int r = 0; r < MR; ++r) {
      const __m512 a = _mm512_set1_ps(A[r * lda + k]);
      c0[r] = _mm512_fmadd_ps(a, b0, c0[r]);
      c1[r] = _mm512_fmadd_ps(a, b1, c1[r]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    _mm512_mask_storeu_ps(C + r * ldc, m0, c0[r]);
    _mm512_mask_storeu_ps(C + r * ldc + 16, m1, c1[r]);
  }
}

using BlockFn = void (*)(int64_t, const float*, int64_t, const float*, int64_t, float*, int64_t, bool,
                         __mmask16, __mmask16);
constexpr BlockFn kBlocks[9] = {nullptr,   block<1>, block<2>, block<3>, block<4>,
                                block<5>, block<6>, block<7>, block<8>};

}  // namespace

void sgemm_avx512(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                  int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  for (int64_t n0 = 0; n0 < N; n0 += 32) {
    const int64_t w = N - n0 < 32 ? N - n0 : 32;
    const __mmask16 m0 = _cvtu32_mask16(w >= 16 ? 0xFFFFu : (1u << w) - 1);
    const __mmask16 m1 = _cvtu32_mask16(w >= 32 ? 0xFFFFu : w > 16 ? (1u << (w - 16)) - 1 : 0u);
    for (int64_t m0r = 0; m0r < M; m0r += 8) {
      const int rows = int(M - m0r < 8 ? M - m0r : 8);
      kBlocks[rows](K, A + m0r * lda, lda, B + n0, ldb, C + m0r * ldc + n0, ldc, accumulate, m0, m1);
    }
  }
}

}  // namespace strata::cpu::detail
