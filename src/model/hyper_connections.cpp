// Hyper-connections and the tail RoPE shared by deepseek4 and deepseek41 (fixtures README,
// hyper-connections).
#include "model/hyper_connections.h"

#include <algorithm>
#include <cmath>

#include "model/blocks.h"

namespace strata {

void rms_norm_plain(float* x, int64_t n_rows, int64_t n, float eps) {
  for (int64_t r = 0; r < n_rows; ++r) cpu::rms_norm(x + r * n, nullptr, n, eps, x + r * n);
}

// The mixers of n_tok tokens from their streams X [n_tok][S][E] (fixtures README: hyper-connections).
HcMix hc_mix(const Backend& be, const HParams& hp, const Weight& fn, const Weight& base_w,
             const Weight& scale_w, const float* X, int64_t n_tok) {
  const int64_t S = hp.hc_streams, E = hp.n_embd, MIX = 2 * S + S * S;
  const float eps = hp.hc_eps;
  std::vector<float> flat(X, X + n_tok * S * E), m(size_t(n_tok * MIX));
  rms_norm_plain(flat.data(), n_tok, S * E, hp.eps);
  be.matmul(fn, flat.data(), n_tok, m.data());
  const float* base = f32(base_w);
  const float* scale = f32(scale_w);
  HcMix out;
  out.pre.resize(size_t(n_tok * S));
  out.post.resize(size_t(n_tok * S));
  out.c.resize(size_t(n_tok * S * S));
  for (int64_t t = 0; t < n_tok; ++t) {
    const float* mt = &m[size_t(t * MIX)];
    for (int64_t s = 0; s < S; ++s) {
      out.pre[size_t(t * S + s)] = sigmoid(mt[s] * scale[0] + base[s]) + eps;
      out.post[size_t(t * S + s)] = 2.0f * sigmoid(mt[S + s] * scale[1] + base[S + s]);
    }
    float* C = &out.c[size_t(t * S * S)];  // C[d * S + s]
    for (int64_t d = 0; d < S; ++d)
      for (int64_t s = 0; s < S; ++s) C[d * S + s] = mt[2 * S + d + S * s] * scale[2] + base[2 * S + d + S * s];
    // Sinkhorn: softmax over d of every column (+ eps), rows normalised, then alternately columns
    // and rows, sinkhorn_iterations - 1 more times
    for (int64_t s = 0; s < S; ++s) {
      float mx = -INFINITY;
      for (int64_t d = 0; d < S; ++d) mx = std::max(mx, C[d * S + s]);
      float sum = 0;
      for (int64_t d = 0; d < S; ++d) sum += C[d * S + s] = std::exp(C[d * S + s] - mx);
      for (int64_t d = 0; d < S; ++d) C[d * S + s] = C[d * S + s] / sum + eps;
    }
    auto rows = [&] {
      for (int64_t d = 0; d < S; ++d) {
        float sum = 0;
        for (int64_t s = 0; s < S; ++s) sum += C[d * S + s];
        for (int64_t s = 0; s < S; ++s) C[d * S + s] /= sum + eps;
      }
    };
    auto cols = [&] {
      for (int64_t s = 0; s < S; ++s) {
        float sum = 0;
        for (int64_t d = 0; d < S; ++d) sum += C[d * S + s];
        for (int64_t d = 0; d < S; ++d) C[d * S + s] /= sum + eps;
      }
    };
    rows();
    for (int it = 1; it < hp.hc_sinkhorn_iters; ++it) {
      cols();
      rows();
    }
  }
  return out;
}

// The sublayer's input: x[t] = sum_s pre[t][s] X[t][s].
void hc_pre(const HcMix& mix, const float* X, int64_t n_tok, int64_t S, int64_t E, float* x) {
  for (int64_t t = 0; t < n_tok; ++t) {
    float* xt = x + t * E;
    std::fill(xt, xt + E, 0.0f);
    for (int64_t s = 0; s < S; ++s) {
      const float w = mix.pre[size_t(t * S + s)];
      const float* Xs = X + (t * S + s) * E;
      for (int64_t i = 0; i < E; ++i) xt[i] += w * Xs[i];
    }
  }
}

// The streams after the sublayer: X'[d] = post[d] y + sum_s C[d][s] X[s].
void hc_post(const HcMix& mix, const float* y, int64_t n_tok, int64_t S, int64_t E, float* X) {
  std::vector<float> old(size_t(S * E));
  for (int64_t t = 0; t < n_tok; ++t) {
    float* Xt = X + t * S * E;
    std::copy(Xt, Xt + S * E, old.begin());
    const float* C = &mix.c[size_t(t * S * S)];
    for (int64_t d = 0; d < S; ++d) {
      float* Xd = Xt + d * E;
      const float p = mix.post[size_t(t * S + d)];
      for (int64_t i = 0; i < E; ++i) Xd[i] = p * y[t * E + i];
      for (int64_t s = 0; s < S; ++s) {
        const float c = C[d * S + s];
        const float* Xs = &old[size_t(s * E)];
        for (int64_t i = 0; i < E; ++i) Xd[i] += c * Xs[i];
      }
    }
  }
}

// Rotates the last n_rot channels of each of n_head heads of width `dim` at position pos (a
// negative position rotates back).
void rope_tail(float* x, int64_t n_head, int64_t dim, int64_t pos, const cpu::RopeParams& p) {
  cpu::rope(x + dim - p.n_rot, int(n_head), int(dim), pos, p);
}

}  // namespace strata
