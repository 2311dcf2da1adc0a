// exp for 16 float lanes, shared by the AVX-512 translation units (sgemm_avx512.cpp's softmax,
// attend_avx512.cpp's online softmax). Included only there, after their GCC 12 diagnostic pragmas;
// in an unnamed namespace as ../avx2/simd_common.h, so each includer compiles its own copy.
#pragma once

#include <immintrin.h>

namespace strata::cpu {
namespace {

// exp(x) by range reduction x = n ln2 + r, |r| <= ln2 / 2, and Cephes' degree-6 polynomial for
// exp(r); 2^n applied by vscalefps. Inputs below -87.3 (including -inf) give exactly 0.
inline __m512 exp16(__m512 x) {
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_LT_OQ);
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.3f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_mov_ps(_knot_mask16(tiny), _mm512_scalef_ps(p, n));
}

}  // namespace
}  // namespace strata::cpu
