// Scalar reference of the float formats and the 32-element block formats (Q4_0, Q4_1, Q5_0, Q5_1,
// Q8_0, Q8_1, IQ4_NL, MXFP4). See quant_ref.h for the contract; the float operation order of every
// expression below is ggml's and must stay so (bit-exactness).
//
// FMA contraction (GCC's C++ default -ffp-contract=fast fuses a * b + c when the target has FMA)
// cannot change a dequantized value: every product there is exact in float (an fp16 scale has 11
// significant bits, the integer factors at most 13 together, except Q6_K and Q8_K, which add
// nothing after their product). It can change the last bits of the dot products' float scaling,
// which only matters for bit-exact comparison with ggml; build the reference for the baseline ISA
// (no FMA) or with -ffp-contract=off to keep them identical.
//
// Layout shared by Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and MXFP4 (32 elements, 16 bytes of nibbles):
//   element j      (j = 0..15) is the low nibble of qs[j]
//   element j + 16 (j = 0..15) is the high nibble of qs[j]
// Q5_0 / Q5_1 add a fifth bit: bit j of the little-endian uint32 qh belongs to element j (0..31).
#include <cmath>
#include <cstring>

#include "base/error.h"
#include "cpu/fp16.h"
#include "cpu/quant_ref.h"

namespace strata::ref {
namespace {

// Blocks in a row of n elements; n must be a whole number of blocks.
int64_t block_count(int64_t n, int block_size) {
  STRATA_CHECK(n >= 0 && n % block_size == 0, "row length is not a multiple of the block size");
  return n / block_size;
}

uint32_t load_qh(const uint8_t qh[4]) {
  uint32_t v;
  std::memcpy(&v, qh, 4);
  return v;
}

// The fifth bit of element j (0..15) and of element j + 16, each moved to bit 4.
uint8_t q5_high_bit_lo(uint32_t qh, int j) {
  return uint8_t(((qh >> j) << 4) & 0x10);
}
uint8_t q5_high_bit_hi(uint32_t qh, int j) {
  return uint8_t((qh >> (j + 12)) & 0x10);
}

// ggml's MAX(amax, fabsf(v)), NaN handling included.
float max_abs(float amax, float v) {
  return amax > std::fabs(v) ? amax : std::fabs(v);
}

}  // namespace

// ---- float formats ----

void dequantize_row_f32(const float* x, float* y, int64_t n) {
  STRATA_CHECK(n >= 0);
  if (n > 0) std::memcpy(y, x, size_t(n) * sizeof(float));  // memcpy of null, even 0 bytes, is undefined
}

void dequantize_row_f16(const uint16_t* x, float* y, int64_t n) {
  STRATA_CHECK(n >= 0);
  for (int64_t i = 0; i < n; ++i) y[i] = fp16_to_f32(x[i]);
}

void dequantize_row_bf16(const uint16_t* x, float* y, int64_t n) {
  STRATA_CHECK(n >= 0);
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_f32(x[i]);
}

// ---- dequantize, 32-element blocks ----

void dequantize_row_q4_0(const block_q4_0* x, float* y, int64_t n) {
  const int64_t nb = block_count(n, QK4_0);
  for (int64_t i = 0; i < nb; ++i, y += QK4_0) {
    const float d = fp16_to_f32(x[i].d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      const int x0 = (x[i].qs[j] & 0x0F) - 8;
      const int x1 = (x[i].qs[j] >> 4) - 8;
      y[j] = float(x0) * d;
      y[j + QK4_0 / 2] = float(x1) * d;
    }
  }
}

void dequantize_row_q4_1(const block_q4_1* x, float* y, int64_t n) {
  const int64_t nb = block_count(n, QK4_1);
  for (int64_t i = 0; i < nb; ++i, y += QK4_1) {
    const float d = fp16_to_f32(x[i].d);
    const float m = fp16_to_f32(x[i].m);
    for (int j = 0; j < QK4_1 / 2; ++j) {
      const int x0 = x[i].qs[j] & 0x0F;
      const int x1 = x[i].qs[j] >> 4;
      y[j] = float(x0) * d + m;
      y[j + QK4_1 / 2] = float(x1) * d + m;
    }
  }
}

void dequantize_row_q5_0(const block_q5_0* x, float* y, int64_t n) {
  const int64_t nb = block_count(n, QK5_0);
  for (int64_t i = 0; i < nb; ++i, y += QK5_0) {
    const float d = fp16_to_f32(x[i].d);
    const uint32_t qh = load_qh(x[i].qh);
    for (int j = 0; j < QK5_0 / 2; ++j) {
      const int x0 = ((x[i].qs[j] & 0x0F) | q5_high_bit_lo(qh, j)) - 16;
      const int x1 = ((x[i].qs[j] >> 4) | q5_high_bit_hi(qh, j)) - 16;
      y[j] = float(x0) * d;
      y[j + QK5_0 / 2] = float(x1) * d;
    }
  }
}

void dequantize_row_q5_1(const block_q5_1* x, float* y, int64_t n) {
  const int64_t nb = block_count(n, QK5_1);
  for (int64_t i = 0; i < nb; ++i, y += QK5_1) {
    const float d = fp16_to_f32(x[i].d);
    const float m = fp16_to_f32(x[i].m);
    const uint32_t qh = load_qh(x[i].qh);
    for (int j = 0; j < QK5_1 / 2; ++j) {
      const int x0 = (x[i].qs[j] & 0x0F) | q5_high_bit_lo(qh, j);
      const int x1 = (x[i].qs[j] >> 4) | q5_high_bit_hi(qh, j);
      y[j] = float(x0) * d + m;
      y[j + QK5_1 / 2] = float(x1) * d + m;
    }
  }
}

void dequantize_row_q8_0(const block_q8_0* x, float* y, int64_t n) {
  const int64_t nb = block_count(n, QK8_0);
  for (int64_t i = 0; i < nb; ++i, y += QK8_0) {
    const float d = fp16_to_f32(x[i].d);
    for (int j = 0; j < QK8_0; ++j) y[j] = float(x[i].qs[j]) * d;
  }
}

void dequantize_row_q8_1(const block_q8_1* x, float* y, int64_t n) {
  const int64_t nb = block_count(n, QK8_0);
  for (int64_t i = 0; i < nb; ++i, y += QK8_0) {
    const float d = fp16_to_f32(x[i].d);
    for (int j = 0; j < QK8_0; ++j) y[j] = float(x[i].qs[j]) * d;
  }
}

void dequantize_row_iq4_nl(const block_iq4_nl* x, float* y, int64_t n) {
  const int64_t nb = block_count(n, QK4_NL);
  for (int64_t i = 0; i < nb; ++i, y += QK4_NL) {
    const float d = fp16_to_f32(x[i].d);
    for (int j = 0; j < QK4_NL / 2; ++j) {
      y[j] = d * float(kvalues_iq4nl[x[i].qs[j] & 0xF]);
      y[j + QK4_NL / 2] = d * float(kvalues_iq4nl[x[i].qs[j] >> 4]);
    }
  }
}

void dequantize_row_mxfp4(const block_mxfp4* x, float* y, int64_t n) {
  const int64_t nb = block_count(n, QK_MXFP4);
  for (int64_t i = 0; i < nb; ++i, y += QK_MXFP4) {
    const float d = e8m0_to_f32_half(x[i].e);  // 2^(e - 128): the codebook is doubled
    for (int j = 0; j < QK_MXFP4 / 2; ++j) {
      y[j] = float(kvalues_mxfp4[x[i].qs[j] & 0xF]) * d;
      y[j + QK_MXFP4 / 2] = float(kvalues_mxfp4[x[i].qs[j] >> 4]) * d;
    }
  }
}

// ---- quantize activations ----

void quantize_row_q8_0(const float* x, block_q8_0* y, int64_t n) {
  const int64_t nb = block_count(n, QK8_0);
  for (int64_t i = 0; i < nb; ++i, x += QK8_0) {
    float amax = 0.0f;
    for (int j = 0; j < QK8_0; ++j) amax = max_abs(amax, x[j]);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_fp16(d);
    for (int j = 0; j < QK8_0; ++j) y[i].qs[j] = int8_t(std::roundf(x[j] * id));
  }
}

void quantize_row_q8_1(const float* x, block_q8_1* y, int64_t n) {
  const int64_t nb = block_count(n, QK8_0);
  for (int64_t i = 0; i < nb; ++i, x += QK8_0) {
    float amax = 0.0f;
    for (int j = 0; j < QK8_0; ++j) amax = max_abs(amax, x[j]);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_fp16(d);
    int sum = 0;
    for (int j = 0; j < QK8_0; ++j) {
      y[i].qs[j] = int8_t(std::roundf(x[j] * id));
      sum += y[i].qs[j];
    }
    y[i].s = f32_to_fp16(float(sum) * d);
  }
}

// ---- dot products ----

float vec_dot_f32_f32(int64_t n, const float* w, const float* a) {
  STRATA_CHECK(n >= 0);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += double(w[i]) * double(a[i]);
  return float(sum);
}

float vec_dot_f16_f32(int64_t n, const uint16_t* w, const float* a) {
  STRATA_CHECK(n >= 0);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += double(fp16_to_f32(w[i])) * double(a[i]);
  return float(sum);
}

float vec_dot_bf16_f32(int64_t n, const uint16_t* w, const float* a) {
  STRATA_CHECK(n >= 0);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += double(bf16_to_f32(w[i])) * double(a[i]);
  return float(sum);
}

// In each block: sumi = sum of q_w * q_a (exact, |sumi| < 2^20); then the float scaling in the
// order ggml's generic code uses for that format.

float vec_dot_q4_0_q8_0(int64_t n, const block_q4_0* w, const block_q8_0* a) {
  const int64_t nb = block_count(n, QK8_0);
  float sumf = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int sumi = 0;
    for (int j = 0; j < QK4_0 / 2; ++j) {
      sumi += ((w[i].qs[j] & 0x0F) - 8) * a[i].qs[j];
      sumi += ((w[i].qs[j] >> 4) - 8) * a[i].qs[j + QK4_0 / 2];
    }
    sumf += float(sumi) * fp16_to_f32(w[i].d) * fp16_to_f32(a[i].d);
  }
  return sumf;
}

float vec_dot_q4_1_q8_1(int64_t n, const block_q4_1* w, const block_q8_1* a) {
  const int64_t nb = block_count(n, QK8_0);
  float sumf = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int sumi = 0;
    for (int j = 0; j < QK4_1 / 2; ++j) {
      sumi += (w[i].qs[j] & 0x0F) * a[i].qs[j];
      sumi += (w[i].qs[j] >> 4) * a[i].qs[j + QK4_1 / 2];
    }
    // (d_w * d_a) * sumi + m_w * s_a, with s_a = d_a * sum(q_a): the min term needs no int math
    sumf += (fp16_to_f32(w[i].d) * fp16_to_f32(a[i].d)) * float(sumi) +
            fp16_to_f32(w[i].m) * fp16_to_f32(a[i].s);
  }
  return sumf;
}

float vec_dot_q5_0_q8_0(int64_t n, const block_q5_0* w, const block_q8_0* a) {
  const int64_t nb = block_count(n, QK8_0);
  float sumf = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    const uint32_t qh = load_qh(w[i].qh);
    int sumi = 0;
    for (int j = 0; j < QK5_0 / 2; ++j) {
      const int x0 = ((w[i].qs[j] & 0x0F) | q5_high_bit_lo(qh, j)) - 16;
      const int x1 = ((w[i].qs[j] >> 4) | q5_high_bit_hi(qh, j)) - 16;
      sumi += x0 * a[i].qs[j];
      sumi += x1 * a[i].qs[j + QK5_0 / 2];
    }
    sumf += (fp16_to_f32(w[i].d) * fp16_to_f32(a[i].d)) * float(sumi);
  }
  return sumf;
}

float vec_dot_q5_1_q8_1(int64_t n, const block_q5_1* w, const block_q8_1* a) {
  const int64_t nb = block_count(n, QK8_0);
  float sumf = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    const uint32_t qh = load_qh(w[i].qh);
    int sumi = 0;
    for (int j = 0; j < QK5_1 / 2; ++j) {
      const int x0 = (w[i].qs[j] & 0x0F) | q5_high_bit_lo(qh, j);
      const int x1 = (w[i].qs[j] >> 4) | q5_high_bit_hi(qh, j);
      sumi += x0 * a[i].qs[j];
      sumi += x1 * a[i].qs[j + QK5_1 / 2];
    }
    sumf += (fp16_to_f32(w[i].d) * fp16_to_f32(a[i].d)) * float(sumi) +
            fp16_to_f32(w[i].m) * fp16_to_f32(a[i].s);
  }
  return sumf;
}

float vec_dot_q8_0_q8_0(int64_t n, const block_q8_0* w, const block_q8_0* a) {
  const int64_t nb = block_count(n, QK8_0);
  float sumf = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int sumi = 0;
    for (int j = 0; j < QK8_0; ++j) sumi += w[i].qs[j] * a[i].qs[j];
    sumf += float(sumi) * (fp16_to_f32(w[i].d) * fp16_to_f32(a[i].d));
  }
  return sumf;
}

float vec_dot_iq4_nl_q8_0(int64_t n, const block_iq4_nl* w, const block_q8_0* a) {
  const int64_t nb = block_count(n, QK8_0);
  float sumf = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_f32(a[i].d) * fp16_to_f32(w[i].d);
    int sumi = 0;
    for (int j = 0; j < QK4_NL / 2; ++j) {
      sumi += a[i].qs[j] * kvalues_iq4nl[w[i].qs[j] & 0xF];
      sumi += a[i].qs[j + QK4_NL / 2] * kvalues_iq4nl[w[i].qs[j] >> 4];
    }
    sumf += d * float(sumi);
  }
  return sumf;
}

float vec_dot_mxfp4_q8_0(int64_t n, const block_mxfp4* w, const block_q8_0* a) {
  const int64_t nb = block_count(n, QK8_0);
  float sumf = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_f32(a[i].d) * e8m0_to_f32_half(w[i].e);
    int sumi = 0;
    for (int j = 0; j < QK_MXFP4 / 2; ++j) {
      sumi += a[i].qs[j] * kvalues_mxfp4[w[i].qs[j] & 0xF];
      sumi += a[i].qs[j + QK_MXFP4 / 2] * kvalues_mxfp4[w[i].qs[j] >> 4];
    }
    sumf += d * float(sumi);
  }
  return sumf;
}

}  // namespace strata::ref
