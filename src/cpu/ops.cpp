#include "cpu/ops.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/error.h"
#include "cpu/kernels.h"
#include "cpu/quant_traits.h"

namespace strata::cpu {

namespace {

// Dot of a dequantized weight row with tokens; the inner loop vectorises.
inline float dot(const float* a, const float* b, int64_t n) {
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

// Stores v into y[t][r]: assigned, or added with the token's scale.
template <bool kAccumulate>
inline void store(float* y, int64_t idx, float v, const float* scale, int64_t t) {
  if constexpr (kAccumulate) {
    y[idx] += scale ? v * scale[t] : v;
  } else {
    y[idx] = v;
  }
}

// Exact path: each row dequantized once for all tokens.
template <bool kAccumulate>
void matmul_exact(const Weight& w, const float* x, int64_t n_tok, const float* scale, float* y) {
  const QuantTraits& qt = quant_traits(w.type);
  STRATA_CHECK(qt.dequantize_row != nullptr, "weight type without dequantize (loader must reject)");
  const int64_t n_in = w.n_in, n_out = w.n_out;
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(n_in));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < n_out; ++r) {
      qt.dequantize_row(w.row(r), row.data(), n_in);
      for (int64_t t = 0; t < n_tok; ++t)
        store<kAccumulate>(y, t * n_out + r, dot(row.data(), x + t * n_in, n_in), scale, t);
    }
  }
}

// Quantized path: activations rounded once per call to the weight type's vec_dot type, then each
// output row dotted with them by the start-up ISA's kernel (cpu_kernels(), kernels.h).
template <bool kAccumulate>
void matmul_quantized(const Weight& w, const float* x, int64_t n_tok, const float* scale, float* y) {
  const QuantTraits& qt = quant_traits(w.type);
  const KernelTable& kernels = cpu_kernels();
  const VecDotFn vec_dot = kernels.dot(w.type);
  STRATA_CHECK(vec_dot != nullptr, "weight type without vec_dot (loader must reject)");
  const int64_t n_in = w.n_in, n_out = w.n_out;
  STRATA_CHECK(n_in % int64_t(qt.block_size) == 0 && n_in % int64_t(quant_traits(qt.vec_dot_type).block_size) == 0,
               "row length is not a whole number of blocks (the kernels do not check)");
  const void* act = x;
  size_t act_row_bytes = size_t(n_in) * sizeof(float);
  std::vector<uint8_t> xq;
  if (qt.vec_dot_type != GgmlType::f32) {
    const QuantizeRowFn quantize = kernels.quantize(qt.vec_dot_type);
    STRATA_CHECK(quantize != nullptr, "vec_dot_type without a quantizer");
    act_row_bytes = ggml_row_bytes(qt.vec_dot_type, uint64_t(n_in));
    xq.resize(act_row_bytes * size_t(n_tok));
    for (int64_t t = 0; t < n_tok; ++t) quantize(x + t * n_in, xq.data() + size_t(t) * act_row_bytes, n_in);
    act = xq.data();
  }
  const auto* a = static_cast<const uint8_t*>(act);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < n_out; ++r) {
    const uint8_t* wr = w.row(r);
    for (int64_t t = 0; t < n_tok; ++t)
      store<kAccumulate>(y, t * n_out + r, vec_dot(n_in, wr, a + size_t(t) * act_row_bytes), scale, t);
  }
}

}  // namespace

void CpuBackend::matmul(const Weight& w, const float* x, int64_t n_tok, float* y) const {
  if (path_ == MatmulPath::exact) matmul_exact<false>(w, x, n_tok, nullptr, y);
  else matmul_quantized<false>(w, x, n_tok, nullptr, y);
}

void CpuBackend::matmul_add(const Weight& w, const float* x, int64_t n_tok, const float* scale,
                            float* y) const {
  if (path_ == MatmulPath::exact) matmul_exact<true>(w, x, n_tok, scale, y);
  else matmul_quantized<true>(w, x, n_tok, scale, y);
}

void get_row(const Weight& w, int64_t row, float* out) {
  const QuantTraits& qt = quant_traits(w.type);
  STRATA_CHECK(qt.dequantize_row != nullptr);
  STRATA_CHECK(row >= 0 && row < w.n_out, "row out of range");
  qt.dequantize_row(w.row(row), out, w.n_in);
}

void rms_norm(const float* x, const float* weight, int64_t n, float eps, float* out) {
  double ss = 0;  // ggml sums squares in ggml_float (double)
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * double(x[i]);
  const float scale = 1.0f / std::sqrt(float(ss / double(n)) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * (weight ? weight[i] : 1.0f);
}

void add(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void softmax(float* x, int64_t n) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = float(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

namespace {

// ggml's rope_yarn_corr_dim: the dimension at which the rotation count at n_ctx_orig is `n_rot`.
float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
  return n_dims * std::log(n_ctx_orig / (n_rot * 2 * float(M_PI))) / (2 * std::log(base));
}

}  // namespace

void rope(float* x, int n_head, int head_dim, int64_t pos, const RopeParams& p) {
  const int n_rot = p.n_rot;
  STRATA_CHECK(n_rot > 0 && n_rot <= head_dim && n_rot % 2 == 0);
  const float theta_scale = std::pow(p.freq_base, -2.0f / float(n_rot));
  float corr_low = 0, corr_high = 0;
  const bool yarn = p.ext_factor != 0.0f;
  if (yarn) {
    corr_low = std::max(0.0f, std::floor(yarn_corr_dim(n_rot, p.n_ctx_orig, p.beta_fast, p.freq_base)));
    corr_high = std::min(float(n_rot - 1), std::ceil(yarn_corr_dim(n_rot, p.n_ctx_orig, p.beta_slow, p.freq_base)));
  }
  const float freq_scale = 1.0f / p.factor;
  float mscale = p.attn_factor;
  if (yarn) mscale *= 1.0f + 0.1f * std::log(1.0f / freq_scale);

  float theta_extrap = float(pos);
  for (int i = 0; i < n_rot / 2; ++i) {
    // ggml's rope_yarn for pair i (i0 = 2i)
    const float theta_interp = freq_scale * theta_extrap;
    float theta = theta_interp;
    if (yarn) {
      const float y = (float(i) - corr_low) / std::max(0.001f, corr_high - corr_low);
      const float ramp = 1.0f - std::min(1.0f, std::max(0.0f, y));
      const float ramp_mix = ramp * p.ext_factor;
      theta = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix;
    }
    const float c = std::cos(theta) * mscale, s = std::sin(theta) * mscale;
    for (int h = 0; h < n_head; ++h) {
      float* v = x + size_t(h) * head_dim;
      const int a = p.kind == RopeKind::neox ? i : 2 * i;
      const int b = p.kind == RopeKind::neox ? i + n_rot / 2 : 2 * i + 1;
      const float x0 = v[a], x1 = v[b];
      v[a] = x0 * c - x1 * s;
      v[b] = x0 * s + x1 * c;
    }
    theta_extrap *= theta_scale;
  }
}

}  // namespace strata::cpu
