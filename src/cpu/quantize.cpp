// Weight quantizers after ggml's reference quantize_row_*_ref (see quantize.h).
#include "cpu/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/error.h"
#include "cpu/fp16.h"
#include "cpu/quant_blocks.h"
#include "cpu/quant_ref.h"

namespace strata {

namespace {

constexpr float kGroupMaxEps = 1e-15f;

// ggml's nearest_int: round to nearest, ties to even (the default rounding mode).
int nearest_int(float v) {
  return int(std::lrintf(v));
}

void quantize_q4_0(const float* x, block_q4_0* y, int64_t n) {
  for (int64_t i = 0; i < n / QK4_0; ++i, x += QK4_0) {
    float amax = 0, max = 0;
    for (int j = 0; j < QK4_0; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    y[i].d = f32_to_fp16(d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      const int q0 = std::min(15, int(int8_t(x[j] * id + 8.5f)));
      const int q1 = std::min(15, int(int8_t(x[QK4_0 / 2 + j] * id + 8.5f)));
      y[i].qs[j] = uint8_t(q0 | (q1 << 4));
    }
  }
}

// ggml's make_qkx2_quants: levels L[0..n) in 0..nmax and (scale, -min) minimising the weighted
// squared error of scale * L + min against x, searched over nstep + 1 trial scales.
float make_qkx2_quants(int n, int nmax, const float* x, const float* w, uint8_t* L, float* the_min, uint8_t* Laux,
                       float rmin, float rdelta, int nstep) {
  float min = x[0], max = x[0], sum_w = w[0], sum_x = w[0] * x[0];
  for (int i = 1; i < n; ++i) {
    min = std::min(min, x[i]);
    max = std::max(max, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill(L, L + n, 0);
    *the_min = -min;
    return 0.0f;
  }
  float iscale = float(nmax) / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = uint8_t(std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax));
    const float diff = scale * L[i] + min - x[i];
    best_error += w[i] * diff * diff;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * float(is) + float(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax);
      Laux[i] = uint8_t(l);
      sum_l += w[i] * float(l);
      sum_l2 += w[i] * float(l) * float(l);
      sum_xl += w[i] * float(l) * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D <= 0) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
    float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
    if (this_min > 0) {
      this_min = 0;
      this_scale = sum_xl / sum_l2;
    }
    float cur_error = 0;
    for (int i = 0; i < n; ++i) {
      const float diff = this_scale * Laux[i] + this_min - x[i];
      cur_error += w[i] * diff * diff;
    }
    if (cur_error < best_error) {
      std::memcpy(L, Laux, size_t(n));
      best_error = cur_error;
      scale = this_scale;
      min = this_min;
    }
  }
  *the_min = -min;
  return scale;
}

void quantize_q4_K(const float* x, block_q4_K* y, int64_t n) {
  uint8_t L[QK_K], Laux[32];
  float w[32], mins[QK_K / 32], scales[QK_K / 32];
  for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 32; ++j) {
      float sum_x2 = 0;
      for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
      const float av_x = std::sqrt(sum_x2 / 32);
      for (int l = 0; l < 32; ++l) w[l] = av_x + std::fabs(x[32 * j + l]);
      scales[j] = make_qkx2_quants(32, 15, x + 32 * j, w, L + 32 * j, &mins[j], Laux, -1.0f, 0.1f, 20);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    std::memset(y[i].scales, 0, sizeof y[i].scales);
    for (int j = 0; j < QK_K / 32; ++j) {
      const uint8_t ls = uint8_t(std::min(63, nearest_int(inv_scale * scales[j])));
      const uint8_t lm = uint8_t(std::min(63, nearest_int(inv_min * mins[j])));
      if (j < 4) {
        y[i].scales[j] = ls;
        y[i].scales[j + 4] = lm;
      } else {
        y[i].scales[j + 4] = uint8_t((ls & 0xF) | ((lm & 0xF) << 4));
        y[i].scales[j - 4] |= uint8_t((ls >> 4) << 6);
        y[i].scales[j] |= uint8_t((lm >> 4) << 6);
      }
    }
    y[i].d = f32_to_fp16(max_scale / 63.0f);
    y[i].dmin = f32_to_fp16(max_min / 63.0f);
    for (int j = 0; j < QK_K / 32; ++j) {
      uint8_t sc, m;
      ref::scale_min_k4(j, y[i].scales, &sc, &m);
      const float d = fp16_to_f32(y[i].d) * float(sc);
      if (d == 0) continue;
      const float dm = fp16_to_f32(y[i].dmin) * float(m);
      for (int l = 0; l < 32; ++l) L[32 * j + l] = uint8_t(std::clamp(nearest_int((x[32 * j + l] + dm) / d), 0, 15));
    }
    uint8_t* q = y[i].qs;
    for (int j = 0; j < QK_K; j += 64, q += 32)
      for (int l = 0; l < 32; ++l) q[l] = uint8_t(L[j + l] | (L[j + l + 32] << 4));
  }
}

// ggml's make_qx_quants with rmse_type 1 (weights x^2): signed levels L[i] - nmax in
// -nmax..nmax-1 and the scale of least weighted error among 19 trial scales.
float make_qx_quants(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    std::fill(L, L + n, int8_t(0));
    return 0.0f;
  }
  auto level = [&](float iscale, int i) { return std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1); };
  float iscale = -float(nmax) / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = level(iscale, i);
    L[i] = int8_t(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * float(l);
    suml2 += w * float(l) * float(l);
  }
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(float(nmax) + 0.1f * float(is)) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = level(iscale, i);
      const float w = x[i] * x[i];
      sumlx += w * x[i] * float(l);
      suml2 += w * float(l) * float(l);
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) L[i] = int8_t(nmax + level(iscale, i));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

void quantize_q6_K(const float* x, block_q6_K* y, int64_t n) {
  int8_t L[QK_K];
  float scales[QK_K / 16];
  for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < QK_K / 16; ++ib) {
      scales[ib] = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
      if (std::fabs(scales[ib]) > max_abs_scale) {
        max_abs_scale = std::fabs(scales[ib]);
        max_scale = scales[ib];
      }
    }
    std::memset(&y[i], 0, sizeof y[i]);
    if (max_abs_scale < kGroupMaxEps) continue;  // all zeros: d = 0
    const float iscale = -128.0f / max_scale;
    y[i].d = f32_to_fp16(1 / iscale);
    for (int ib = 0; ib < QK_K / 16; ++ib) y[i].scales[ib] = int8_t(std::min(127, nearest_int(iscale * scales[ib])));
    for (int j = 0; j < QK_K / 16; ++j) {
      const float d = fp16_to_f32(y[i].d) * float(y[i].scales[j]);
      if (d == 0) continue;
      for (int l = 0; l < 16; ++l) L[16 * j + l] = int8_t(std::clamp(nearest_int(x[16 * j + l] / d), -32, 31) + 32);
    }
    uint8_t* ql = y[i].ql;
    uint8_t* qh = y[i].qh;
    for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
      for (int l = 0; l < 32; ++l) {
        const int q1 = L[j + l], q2 = L[j + l + 32], q3 = L[j + l + 64], q4 = L[j + l + 96];
        ql[l] = uint8_t((q1 & 0xF) | ((q3 & 0xF) << 4));
        ql[l + 32] = uint8_t((q2 & 0xF) | ((q4 & 0xF) << 4));
        qh[l] = uint8_t((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
      }
    }
  }
}

int best_index_mxfp4(float x, float d) {
  int best = 0;
  float best_err = std::fabs(float(kvalues_mxfp4[0]) * d - x);
  for (int i = 1; i < 16; ++i) {
    const float err = std::fabs(float(kvalues_mxfp4[i]) * d - x);
    if (err < best_err) {
      best = i;
      best_err = err;
    }
  }
  return best;
}

void quantize_mxfp4(const float* x, block_mxfp4* y, int64_t n) {
  for (int64_t i = 0; i < n / QK_MXFP4; ++i, x += QK_MXFP4) {
    float amax = 0;
    for (int j = 0; j < QK_MXFP4; ++j) amax = std::max(amax, std::fabs(x[j]));
    const uint8_t e = amax > 0 ? uint8_t(std::floor(std::log2(amax)) - 2 + 127) : 0;
    const float d = e8m0_to_f32_half(e);
    y[i].e = e;
    for (int j = 0; j < QK_MXFP4 / 2; ++j)
      y[i].qs[j] = uint8_t(best_index_mxfp4(x[j], d) | (best_index_mxfp4(x[QK_MXFP4 / 2 + j], d) << 4));
  }
}

}  // namespace

bool can_quantize(GgmlType type) {
  switch (type) {
    case GgmlType::f32:
    case GgmlType::f16:
    case GgmlType::q8_0:
    case GgmlType::q4_0:
    case GgmlType::q4_k:
    case GgmlType::q6_k:
    case GgmlType::mxfp4:
      return true;
    default:
      return false;
  }
}

void quantize_row(GgmlType type, const float* x, void* out, int64_t n) {
  STRATA_CHECK(can_quantize(type), "quantize_row: unsupported type");
  STRATA_CHECK(n % int64_t(ggml_traits(type).block_size) == 0, "quantize_row: n is not a multiple of the block size");
  switch (type) {
    case GgmlType::f32:
      std::memcpy(out, x, size_t(n) * sizeof(float));
      break;
    case GgmlType::f16: {
      auto* y = static_cast<uint16_t*>(out);
      for (int64_t i = 0; i < n; ++i) y[i] = f32_to_fp16(x[i]);
      break;
    }
    case GgmlType::q8_0:
      ref::quantize_row_q8_0(x, static_cast<block_q8_0*>(out), n);
      break;
    case GgmlType::q4_0:
      quantize_q4_0(x, static_cast<block_q4_0*>(out), n);
      break;
    case GgmlType::q4_k:
      quantize_q4_K(x, static_cast<block_q4_K*>(out), n);
      break;
    case GgmlType::q6_k:
      quantize_q6_K(x, static_cast<block_q6_K*>(out), n);
      break;
    case GgmlType::mxfp4:
      quantize_mxfp4(x, static_cast<block_mxfp4*>(out), n);
      break;
    default:
      break;
  }
}

}  // namespace strata
