// Scalar reference of the quant formats: dequantize a row, quantize activations, and the dot
// product of one weight row with one activation row. Plain loops, no intrinsics: this is the
// definition that the AVX2 / AVX-512 / CUDA kernels are tested against (STYLE.md 4, 11).
//
// Bit-exactness. Every dequantize_row_* computes exactly what ggml's dequantize_row_*
// (ggml-quants.c) computes: the same float operations in the same order (for example Q4_K:
// (d * sc) * q - dmin * m), so its output is bit-identical to llama.cpp's. The activation quantizers are
// ggml's reference quantize_row_q8_0_ref / q8_1_ref / q8_K_ref, bit-exact too (see "x86" below).
//
// Dot products. vec_dot_<w>_<a> is the math of ggml's vec_dot for that weight type, the activation
// row already quantized to the weight type's vec_dot type (quant_traits.h says which): per block,
// the products of the integer quants are summed exactly in int32 (weighted by the integer sub-block
// scales), then scaled once by the float block scales and accumulated in float over the blocks.
// For the 32-element formats the float operation order is ggml's generic one, so the result is
// bit-identical to ggml_vec_dot_*_generic. For the 256-element K formats the integer sums are
// identical but the float part is block by block (sum += d * isum - dmin * isum_mins) where ggml's
// generic code keeps 8 float lanes; the two differ by float rounding only (a few ulp of the
// row's magnitude).
//
// x86: llama.cpp's AVX/AVX2 quantize_row_q8_0 / q8_1 differ from the ggml reference implemented
// here: they multiply by 127/amax (not 1/(amax/127)) and round half to even (not half away from
// zero), so a quant can differ by 1 where x * scale lands near .5. Q8_K has no SIMD variant on x86.
//
// All lengths `n` are element counts and must be multiples of the format's block size (checked).
// Pointers: a row is an array of n / block_size blocks, contiguous; the functions keep no state and
// may be called from any thread.
#pragma once

#include <cstdint>

#include "cpu/quant_blocks.h"

namespace strata::ref {

// ---- dequantize: y[0..n) from a row of blocks ----
void dequantize_row_f32(const float* x, float* y, int64_t n);
void dequantize_row_f16(const uint16_t* x, float* y, int64_t n);   // x: IEEE half bits
void dequantize_row_bf16(const uint16_t* x, float* y, int64_t n);  // x: bfloat16 bits
void dequantize_row_q4_0(const block_q4_0* x, float* y, int64_t n);
void dequantize_row_q4_1(const block_q4_1* x, float* y, int64_t n);
void dequantize_row_q5_0(const block_q5_0* x, float* y, int64_t n);
void dequantize_row_q5_1(const block_q5_1* x, float* y, int64_t n);
void dequantize_row_q8_0(const block_q8_0* x, float* y, int64_t n);
void dequantize_row_q8_1(const block_q8_1* x, float* y, int64_t n);
void dequantize_row_q2_K(const block_q2_K* x, float* y, int64_t n);
void dequantize_row_q3_K(const block_q3_K* x, float* y, int64_t n);
void dequantize_row_q4_K(const block_q4_K* x, float* y, int64_t n);
void dequantize_row_q5_K(const block_q5_K* x, float* y, int64_t n);
void dequantize_row_q6_K(const block_q6_K* x, float* y, int64_t n);
void dequantize_row_q8_K(const block_q8_K* x, float* y, int64_t n);
void dequantize_row_iq4_nl(const block_iq4_nl* x, float* y, int64_t n);
void dequantize_row_iq4_xs(const block_iq4_xs* x, float* y, int64_t n);
void dequantize_row_mxfp4(const block_mxfp4* x, float* y, int64_t n);

// ---- quantize activations: a float row x[0..n) into blocks ----
// Q8_0: per 32 elements d = amax / 127 (stored as fp16), q = roundf(x * (1 / d)). The quants are
// computed with the unrounded d, so dequantized with the stored fp16 d they are within
// d * (0.5 + 127 * 2^-11) of x, not d / 2.
void quantize_row_q8_0(const float* x, block_q8_0* y, int64_t n);
// Q8_1: as Q8_0, plus s = fp16(d * sum(q)) for the min terms of Q4_1 / Q5_1.
void quantize_row_q8_1(const float* x, block_q8_1* y, int64_t n);
// Q8_K: per 256 elements, with max the element of largest magnitude (its sign kept):
// iscale = -127 / max, q = nearest_int(iscale * x) (round half to even), d = 1 / iscale (float, so
// negative when max > 0), bsums[j] = sum of q[16j .. 16j + 16). A block of zeros has d = 0, q = 0
// and bsums = 0 (ggml leaves its bsums unwritten).
void quantize_row_q8_K(const float* x, block_q8_K* y, int64_t n);

// ---- dot products: one weight row . one activation row, n elements ----
// Float weights take float activations and accumulate in double (as ggml's scalar f32 dot does;
// ggml converts the activations to f16 / bf16 for F16 / BF16 weights, strata keeps them f32).
float vec_dot_f32_f32(int64_t n, const float* w, const float* a);
float vec_dot_f16_f32(int64_t n, const uint16_t* w, const float* a);
float vec_dot_bf16_f32(int64_t n, const uint16_t* w, const float* a);
float vec_dot_q4_0_q8_0(int64_t n, const block_q4_0* w, const block_q8_0* a);
float vec_dot_q4_1_q8_1(int64_t n, const block_q4_1* w, const block_q8_1* a);
float vec_dot_q5_0_q8_0(int64_t n, const block_q5_0* w, const block_q8_0* a);
float vec_dot_q5_1_q8_1(int64_t n, const block_q5_1* w, const block_q8_1* a);
float vec_dot_q8_0_q8_0(int64_t n, const block_q8_0* w, const block_q8_0* a);
float vec_dot_iq4_nl_q8_0(int64_t n, const block_iq4_nl* w, const block_q8_0* a);
float vec_dot_mxfp4_q8_0(int64_t n, const block_mxfp4* w, const block_q8_0* a);
float vec_dot_q2_K_q8_K(int64_t n, const block_q2_K* w, const block_q8_K* a);
float vec_dot_q3_K_q8_K(int64_t n, const block_q3_K* w, const block_q8_K* a);
float vec_dot_q4_K_q8_K(int64_t n, const block_q4_K* w, const block_q8_K* a);
float vec_dot_q5_K_q8_K(int64_t n, const block_q5_K* w, const block_q8_K* a);
float vec_dot_q6_K_q8_K(int64_t n, const block_q6_K* w, const block_q8_K* a);
float vec_dot_iq4_xs_q8_K(int64_t n, const block_iq4_xs* w, const block_q8_K* a);

// ---- shared helpers of the K formats (exposed for the SIMD variants and the tests) ----

// Q4_K / Q5_K: the 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes:
//   j < 4:  sc = q[j] & 63,                         m = q[j + 4] & 63
//   j >= 4: sc = (q[j + 4] & 15) | (q[j - 4] >> 6) << 4, m = (q[j + 4] >> 4) | (q[j] >> 6) << 4
// (ggml's get_scale_min_k4).
inline void scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Q3_K: the 16 6-bit scales (0..63, to be used as scale - 32) from the 12 packed bytes:
// low 4 bits of scale j in byte j % 8 (low nibble for j < 8, high nibble for j >= 8), high 2 bits
// in byte 8 + j % 4 at bit 2 * (j / 4).
inline void unpack_scales_q3_K(const uint8_t* packed, int8_t out[16]) {
  for (int j = 0; j < 16; ++j) {
    const int low = j < 8 ? (packed[j] & 0xF) : (packed[j - 8] >> 4);
    const int high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
    out[j] = int8_t(low | (high << 4));
  }
}

// IQ4_XS: the 6-bit scale (0..63, used as ls - 32) of sub-block ib (0..7): low 4 bits in nibble
// ib % 2 of scales_l[ib / 2], high 2 bits at bit 2 * ib of scales_h.
inline int scale_iq4_xs(const block_iq4_xs& b, int ib) {
  return ((b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((b.scales_h >> (2 * ib)) & 3) << 4);
}

}  // namespace strata::ref
