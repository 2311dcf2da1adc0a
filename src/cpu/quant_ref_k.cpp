// Scalar reference of the 256-element super-block formats: the K-quants (Q2_K .. Q6_K), Q8_K and
// IQ4_XS. See quant_ref.h for the contract; the float operation order of every dequantize
// expression is ggml's and must stay so (bit-exactness; see quant_ref_q.cpp on FMA contraction).
//
// Element layouts (e = 0..255 is the element's index in the super-block):
//   Q2_K, Q3_K  e = 128 h + 32 k + l (h 0..1, k 0..3, l 0..31): bits 2k..2k+1 of qs[32 h + l];
//               sub-block (16 elements) e / 16.
//               Q3_K's third bit is bit e / 32 of hmask[e % 32]: set -> q, clear -> q - 4.
//   Q4_K, Q5_K  e = 64 h + 32 k + l (h 0..3, k 0..1, l 0..31): low (k = 0) or high (k = 1) nibble
//               of qs[32 h + l]; sub-block (32 elements) e / 32.
//               Q5_K's fifth bit is bit e / 32 of qh[e % 32].
//   Q6_K        e = 128 h + 32 k + l (h 0..1, k 0..3, l 0..31): low 4 bits are nibble k / 2 of
//               ql[64 h + 32 (k % 2) + l], high 2 bits are bits 2k..2k+1 of qh[32 h + l];
//               value q - 32 (-32..31); sub-block (16 elements) e / 16, int8 scale.
//   IQ4_XS      8 sub-blocks of 32 laid out like Q4_0: element 32 ib + j is the low nibble of
//               qs[16 ib + j], element 32 ib + 16 + j the high nibble (j 0..15).
#include <cmath>
#include <cstring>

#include "base/error.h"
#include "cpu/fp16.h"
#include "cpu/quant_ref.h"

namespace strata::ref {
namespace {

int64_t super_block_count(int64_t n) {
  STRATA_CHECK(n >= 0 && n % QK_K == 0, "row length is not a multiple of 256");
  return n / QK_K;
}

// ggml's nearest_int: round to nearest, ties to even (ggml adds 1.5 * 2^23 and reads the low
// mantissa bits; same result for |f| <= 2^22). nearbyint has no addition that a compiler could fuse
// with the caller's multiply into an FMA, which would change the rounding.
int nearest_int(float f) {
  return int(std::nearbyint(f));
}

// The 2-bit field of element e of Q2_K / Q3_K (layout above).
int q2_field(const uint8_t* qs, int e) {
  const int h = e / 128, k = (e % 128) / 32, l = e % 32;
  return (qs[32 * h + l] >> (2 * k)) & 3;
}

// The signed 3-bit value (-4..3) of element e of Q3_K.
int q3_value(const block_q3_K& b, int e) {
  const bool high = (b.hmask[e % 32] >> (e / 32)) & 1;
  return q2_field(b.qs, e) - (high ? 0 : 4);
}

// The 4-bit field of element e of Q4_K / Q5_K (layout above).
int q4k_field(const uint8_t* qs, int e) {
  const int h = e / 64, k = (e % 64) / 32, l = e % 32;
  return (qs[32 * h + l] >> (4 * k)) & 0xF;
}

// The 5-bit value (0..31) of element e of Q5_K.
int q5k_value(const block_q5_K& b, int e) {
  return q4k_field(b.qs, e) + (((b.qh[e % 32] >> (e / 32)) & 1) ? 16 : 0);
}

// The signed 6-bit value (-32..31) of element e of Q6_K.
int q6k_value(const block_q6_K& b, int e) {
  const int h = e / 128, k = (e % 128) / 32, l = e % 32;
  const int low = (b.ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0xF;
  const int high = (b.qh[32 * h + l] >> (2 * k)) & 3;
  return (low | (high << 4)) - 32;
}

// The codebook index of element e of IQ4_XS.
int iq4xs_index(const block_iq4_xs& b, int e) {
  const int ib = e / 32, j = e % 32;
  return j < 16 ? (b.qs[16 * ib + j] & 0xF) : (b.qs[16 * ib + j - 16] >> 4);
}

}  // namespace

// ---- dequantize ----

void dequantize_row_q2_K(const block_q2_K* x, float* y, int64_t n) {
  const int64_t nb = super_block_count(n);
  for (int64_t i = 0; i < nb; ++i, y += QK_K) {
    const float d = fp16_to_f32(x[i].d);
    const float dmin = fp16_to_f32(x[i].dmin);
    for (int s = 0; s < QK_K / 16; ++s) {
      const uint8_t sc = x[i].scales[s];
      const float dl = d * float(sc & 0xF);
      const float ml = dmin * float(sc >> 4);
      for (int e = 16 * s; e < 16 * s + 16; ++e) y[e] = dl * float(q2_field(x[i].qs, e)) - ml;
    }
  }
}

void dequantize_row_q3_K(const block_q3_K* x, float* y, int64_t n) {
  const int64_t nb = super_block_count(n);
  for (int64_t i = 0; i < nb; ++i, y += QK_K) {
    const float d = fp16_to_f32(x[i].d);
    int8_t scales[16];
    unpack_scales_q3_K(x[i].scales, scales);
    for (int s = 0; s < QK_K / 16; ++s) {
      const float dl = d * float(scales[s] - 32);
      for (int e = 16 * s; e < 16 * s + 16; ++e) y[e] = dl * float(q3_value(x[i], e));
    }
  }
}

void dequantize_row_q4_K(const block_q4_K* x, float* y, int64_t n) {
  const int64_t nb = super_block_count(n);
  for (int64_t i = 0; i < nb; ++i, y += QK_K) {
    const float d = fp16_to_f32(x[i].d);
    const float dmin = fp16_to_f32(x[i].dmin);
    for (int s = 0; s < QK_K / 32; ++s) {
      uint8_t sc, m;
      scale_min_k4(s, x[i].scales, &sc, &m);
      const float dl = d * float(sc);
      const float ml = dmin * float(m);
      for (int e = 32 * s; e < 32 * s + 32; ++e) y[e] = dl * float(q4k_field(x[i].qs, e)) - ml;
    }
  }
}

void dequantize_row_q5_K(const block_q5_K* x, float* y, int64_t n) {
  const int64_t nb = super_block_count(n);
  for (int64_t i = 0; i < nb; ++i, y += QK_K) {
    const float d = fp16_to_f32(x[i].d);
    const float dmin = fp16_to_f32(x[i].dmin);
    for (int s = 0; s < QK_K / 32; ++s) {
      uint8_t sc, m;
      scale_min_k4(s, x[i].scales, &sc, &m);
      const float dl = d * float(sc);
      const float ml = dmin * float(m);
      for (int e = 32 * s; e < 32 * s + 32; ++e) y[e] = dl * float(q5k_value(x[i], e)) - ml;
    }
  }
}

void dequantize_row_q6_K(const block_q6_K* x, float* y, int64_t n) {
  const int64_t nb = super_block_count(n);
  for (int64_t i = 0; i < nb; ++i, y += QK_K) {
    const float d = fp16_to_f32(x[i].d);
    for (int e = 0; e < QK_K; ++e) {
      // (d * sc) * q, as ggml's d * sc[is] * q
      y[e] = d * float(x[i].scales[e / 16]) * float(q6k_value(x[i], e));
    }
  }
}

void dequantize_row_q8_K(const block_q8_K* x, float* y, int64_t n) {
  const int64_t nb = super_block_count(n);
  for (int64_t i = 0; i < nb; ++i, y += QK_K) {
    for (int e = 0; e < QK_K; ++e) y[e] = x[i].d * float(x[i].qs[e]);
  }
}

void dequantize_row_iq4_xs(const block_iq4_xs* x, float* y, int64_t n) {
  const int64_t nb = super_block_count(n);
  for (int64_t i = 0; i < nb; ++i, y += QK_K) {
    const float d = fp16_to_f32(x[i].d);
    for (int ib = 0; ib < QK_K / 32; ++ib) {
      const float dl = d * float(scale_iq4_xs(x[i], ib) - 32);
      for (int e = 32 * ib; e < 32 * ib + 32; ++e) {
        y[e] = dl * float(kvalues_iq4nl[iq4xs_index(x[i], e)]);
      }
    }
  }
}

// ---- quantize activations ----

void quantize_row_q8_K(const float* x, block_q8_K* y, int64_t n) {
  const int64_t nb = super_block_count(n);
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float max = 0.0f, amax = 0.0f;  // the element of largest magnitude, and that magnitude
    for (int e = 0; e < QK_K; ++e) {
      const float ax = std::fabs(x[e]);
      if (ax > amax) {
        amax = ax;
        max = x[e];
      }
    }
    if (amax == 0.0f) {
      // ggml leaves bsums unwritten here; we zero them so the block's bytes are defined
      std::memset(&y[i], 0, sizeof(block_q8_K));
      continue;
    }
    const float iscale = -127.0f / max;
    for (int e = 0; e < QK_K; ++e) {
      const int v = nearest_int(iscale * x[e]);
      y[i].qs[e] = int8_t(v < 127 ? v : 127);
    }
    for (int j = 0; j < QK_K / 16; ++j) {
      int sum = 0;
      for (int e = 16 * j; e < 16 * j + 16; ++e) sum += y[i].qs[e];
      y[i].bsums[j] = int16_t(sum);
    }
    y[i].d = 1.0f / iscale;
  }
}

// ---- dot products ----
// Per super-block: isum = sum over sub-blocks of scale * (sum of q_w * q_a), exact in int32 (the
// largest, Q6_K and IQ4_XS, stay below 128 * 127 * 32 * 256 < 2^27). Formats with mins subtract
// dmin * sum over sub-blocks of min * (sum of q_a), where the activation sums come from bsums.
// Then sumf += d * isum - dmin * isum_mins with d = d_w * d_a in float.

float vec_dot_q2_K_q8_K(int64_t n, const block_q2_K* w, const block_q8_K* a) {
  const int64_t nb = super_block_count(n);
  float sumf = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int isum = 0, isum_mins = 0;
    for (int s = 0; s < QK_K / 16; ++s) {
      int sub = 0;
      for (int e = 16 * s; e < 16 * s + 16; ++e) sub += a[i].qs[e] * q2_field(w[i].qs, e);
      isum += (w[i].scales[s] & 0xF) * sub;
      isum_mins += (w[i].scales[s] >> 4) * a[i].bsums[s];
    }
    const float dall = a[i].d * fp16_to_f32(w[i].d);
    const float dmin = a[i].d * fp16_to_f32(w[i].dmin);
    sumf += dall * float(isum) - dmin * float(isum_mins);
  }
  return sumf;
}

float vec_dot_q3_K_q8_K(int64_t n, const block_q3_K* w, const block_q8_K* a) {
  const int64_t nb = super_block_count(n);
  float sumf = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int8_t scales[16];
    unpack_scales_q3_K(w[i].scales, scales);
    int isum = 0;
    for (int s = 0; s < QK_K / 16; ++s) {
      int sub = 0;
      for (int e = 16 * s; e < 16 * s + 16; ++e) sub += a[i].qs[e] * q3_value(w[i], e);
      isum += (scales[s] - 32) * sub;
    }
    const float d = fp16_to_f32(w[i].d) * a[i].d;
    sumf += d * float(isum);
  }
  return sumf;
}

float vec_dot_q4_K_q8_K(int64_t n, const block_q4_K* w, const block_q8_K* a) {
  const int64_t nb = super_block_count(n);
  float sumf = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int isum = 0, isum_mins = 0;
    for (int s = 0; s < QK_K / 32; ++s) {
      uint8_t sc, m;
      scale_min_k4(s, w[i].scales, &sc, &m);
      int sub = 0;
      for (int e = 32 * s; e < 32 * s + 32; ++e) sub += a[i].qs[e] * q4k_field(w[i].qs, e);
      isum += sc * sub;
      isum_mins += m * (a[i].bsums[2 * s] + a[i].bsums[2 * s + 1]);
    }
    const float d = fp16_to_f32(w[i].d) * a[i].d;
    const float dmin = fp16_to_f32(w[i].dmin) * a[i].d;
    sumf += d * float(isum) - dmin * float(isum_mins);
  }
  return sumf;
}

float vec_dot_q5_K_q8_K(int64_t n, const block_q5_K* w, const block_q8_K* a) {
  const int64_t nb = super_block_count(n);
  float sumf = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int isum = 0, isum_mins = 0;
    for (int s = 0; s < QK_K / 32; ++s) {
      uint8_t sc, m;
      scale_min_k4(s, w[i].scales, &sc, &m);
      int sub = 0;
      for (int e = 32 * s; e < 32 * s + 32; ++e) sub += a[i].qs[e] * q5k_value(w[i], e);
      isum += sc * sub;
      isum_mins += m * (a[i].bsums[2 * s] + a[i].bsums[2 * s + 1]);
    }
    const float d = fp16_to_f32(w[i].d) * a[i].d;
    const float dmin = fp16_to_f32(w[i].dmin) * a[i].d;
    sumf += d * float(isum) - dmin * float(isum_mins);
  }
  return sumf;
}

float vec_dot_q6_K_q8_K(int64_t n, const block_q6_K* w, const block_q8_K* a) {
  const int64_t nb = super_block_count(n);
  float sumf = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int isum = 0;
    for (int s = 0; s < QK_K / 16; ++s) {
      int sub = 0;
      for (int e = 16 * s; e < 16 * s + 16; ++e) sub += a[i].qs[e] * q6k_value(w[i], e);
      isum += w[i].scales[s] * sub;
    }
    const float d = fp16_to_f32(w[i].d) * a[i].d;
    sumf += d * float(isum);
  }
  return sumf;
}

float vec_dot_iq4_xs_q8_K(int64_t n, const block_iq4_xs* w, const block_q8_K* a) {
  const int64_t nb = super_block_count(n);
  float sumf = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int isum = 0;
    for (int ib = 0; ib < QK_K / 32; ++ib) {
      int sub = 0;
      for (int e = 32 * ib; e < 32 * ib + 32; ++e) {
        sub += a[i].qs[e] * kvalues_iq4nl[iq4xs_index(w[i], e)];
      }
      isum += (scale_iq4_xs(w[i], ib) - 32) * sub;
    }
    const float d = fp16_to_f32(w[i].d) * a[i].d;
    sumf += d * float(isum);
  }
  return sumf;
}

}  // namespace strata::ref
