#include "model/blocks.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace strata {

namespace {

// cpu::softmax of x[0..n) with an extra logit `sink` in the denominator that takes no output
// (ggml's soft_max_ext with sinks).
void softmax_with_sink(float* x, int64_t n, float sink) {
  float mx = sink;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = std::exp(sink - mx);
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = float(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace

Routing route(const cpu::CpuBackend& be, const HParams& hp, const LayerWeights& l, const float* h,
              int64_t n_tok) {
  const int n_exp = hp.n_expert, k = hp.n_expert_used;
  std::vector<float> logits(size_t(n_tok) * size_t(n_exp));
  be.matmul(l.router, h, n_tok, logits.data());
  add_bias(logits.data(), l.router_b, n_tok, n_exp);

  Routing r;
  r.k = k;
  r.ids.resize(size_t(n_tok) * size_t(k));
  r.weights.resize(size_t(n_tok) * size_t(k));
  std::vector<float> prob(n_exp), select(n_exp), chosen(k);
  std::vector<int> order(n_exp);
  for (int64_t t = 0; t < n_tok; ++t) {
    float* z = logits.data() + t * n_exp;
    // prob: what the chosen experts are weighted by; select: what they are chosen by
    switch (hp.gating) {
      case Gating::softmax:
        std::copy(z, z + n_exp, prob.begin());
        cpu::softmax(prob.data(), n_exp);
        break;
      case Gating::sigmoid:
        for (int e = 0; e < n_exp; ++e) prob[size_t(e)] = 1.0f / (1.0f + std::exp(-z[e]));
        break;
      case Gating::softmax_topk:  // chosen by the logits; the softmax over the chosen comes below
        std::copy(z, z + n_exp, prob.begin());
        break;
    }
    for (int e = 0; e < n_exp; ++e)
      select[size_t(e)] = prob[size_t(e)] + (l.exp_probs_b ? f32(l.exp_probs_b)[e] : 0.0f);

    if (hp.n_group > 1 && hp.n_group_used < hp.n_group) {
      // group-limited: keep the n_group_used groups whose top-2 selection scores sum highest
      const int per = n_exp / hp.n_group;
      std::vector<std::pair<float, int>> group_score;
      for (int g = 0; g < hp.n_group; ++g) {
        std::vector<float> s(select.begin() + g * per, select.begin() + (g + 1) * per);
        std::partial_sort(s.begin(), s.begin() + std::min(2, per), s.end(), std::greater<>());
        group_score.push_back({s[0] + (per > 1 ? s[1] : 0.0f), g});
      }
      std::stable_sort(group_score.begin(), group_score.end(),
                       [](auto& a, auto& b) { return a.first > b.first; });
      for (int gi = hp.n_group_used; gi < hp.n_group; ++gi) {
        const int g = group_score[size_t(gi)].second;
        for (int e = g * per; e < (g + 1) * per; ++e) select[size_t(e)] = -INFINITY;
      }
    }
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return select[size_t(a)] > select[size_t(b)]; });
    for (int j = 0; j < k; ++j) chosen[size_t(j)] = prob[size_t(order[size_t(j)])];
    if (hp.gating == Gating::softmax_topk) cpu::softmax(chosen.data(), k);
    float sum = 0;
    for (int j = 0; j < k; ++j) sum += chosen[size_t(j)];
    for (int j = 0; j < k; ++j) {
      float w = chosen[size_t(j)];
      if (hp.norm_topk) w /= sum;
      r.ids[size_t(t * k + j)] = order[size_t(j)];
      r.weights[size_t(t * k + j)] = w * hp.expert_weights_scale;
    }
  }
  return r;
}

void swiglu_ffn(const cpu::CpuBackend& be, const Weight& gate, const Weight& up, const Weight& down, const float* h,
                int64_t n_tok, const float* scale, bool accumulate, float* out, const SwigluOptions& opt) {
  const int64_t F = gate.n_out, E = down.n_out;
  std::vector<float> g(size_t(n_tok * F)), u(size_t(n_tok * F));
  be.matmul(gate, h, n_tok, g.data());
  be.matmul(up, h, n_tok, u.data());
  for (int64_t t = 0; t < n_tok; ++t) {
    if (opt.gate_b) cpu::add(&g[size_t(t * F)], opt.gate_b, F);
    if (opt.up_b) cpu::add(&u[size_t(t * F)], opt.up_b, F);
  }
  switch (opt.glu.kind) {
    case GluKind::silu:
      for (size_t i = 0; i < g.size(); ++i) g[i] = cpu::silu(g[i]) * u[i];
      break;
    case GluKind::swiglu_oai: {
      const float alpha = opt.glu.alpha, limit = opt.glu.limit;
      for (size_t i = 0; i < g.size(); ++i) {
        const float x = std::min(g[i], limit), y = std::clamp(u[i], -limit, limit);
        g[i] = x / (1.0f + std::exp(-alpha * x)) * (y + 1.0f);
      }
      break;
    }
  }
  const float* b = opt.down_b;
  if (accumulate) {
    be.matmul_add(down, g.data(), n_tok, scale, out);
    for (int64_t t = 0; b && t < n_tok; ++t)
      for (int64_t i = 0; i < E; ++i) out[t * E + i] += b[i] * (scale ? scale[t] : 1.0f);
  } else {
    be.matmul(down, g.data(), n_tok, out);
    for (int64_t t = 0; t < n_tok; ++t) {
      if (b) cpu::add(out + t * E, b, E);
      if (scale)
        for (int64_t i = 0; i < E; ++i) out[t * E + i] *= scale[t];
    }
  }
}

void moe_ffn(const cpu::CpuBackend& be, const LayerWeights& l, const Routing& r, const float* h, int64_t n_tok, int64_t n_embd,
             float* out, const GluParams& glu) {
  std::fill(out, out + n_tok * n_embd, 0.0f);
  const int64_t n_exp = l.gate_exps.n_mat;
  // tokens of each expert, in token order
  std::vector<std::vector<int64_t>> tokens(static_cast<size_t>(n_exp));
  std::vector<std::vector<float>> weights(static_cast<size_t>(n_exp));
  for (int64_t t = 0; t < n_tok; ++t) {
    for (int j = 0; j < r.k; ++j) {
      const int e = r.ids[size_t(t * r.k + j)];
      tokens[size_t(e)].push_back(t);
      weights[size_t(e)].push_back(r.weights[size_t(t * r.k + j)]);
    }
  }
  const int64_t F = l.gate_exps.n_out;
  // expert e's bias: row e of a stacked [n_expert][width] bias (null when the layer has none)
  auto bias = [](const Weight& b, int64_t e, int64_t width) {
    return b ? f32(b) + e * width : nullptr;
  };
  std::vector<float> x, y;
  for (int64_t e = 0; e < n_exp; ++e) {
    const auto& toks = tokens[size_t(e)];
    if (toks.empty()) continue;
    const int64_t n = int64_t(toks.size());
    x.resize(size_t(n * n_embd));
    y.resize(size_t(n * n_embd));
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(h + toks[size_t(i)] * n_embd, n_embd, x.begin() + i * n_embd);
    const SwigluOptions opt{.gate_b = bias(l.gate_exps_b, e, F), .up_b = bias(l.up_exps_b, e, F),
                            .down_b = bias(l.down_exps_b, e, n_embd), .glu = glu};
    swiglu_ffn(be, l.gate_exps.slice(e), l.up_exps.slice(e), l.down_exps.slice(e), x.data(), n,
               weights[size_t(e)].data(), false, y.data(), opt);
    for (int64_t i = 0; i < n; ++i) cpu::add(out + toks[size_t(i)] * n_embd, y.data() + i * n_embd, n_embd);
  }
}

void attention_gqa(const AttentionParams& p, KvCache& cache, int layer, const float* q,
                   int64_t n_tok, int64_t pos0, float* out) {
  const int group = p.n_head / p.n_head_kv;
  const int64_t n_kv = pos0 + n_tok;
#pragma omp parallel
  {
    std::vector<float> score(static_cast<size_t>(n_kv));
#pragma omp for collapse(2) schedule(static)
    for (int64_t t = 0; t < n_tok; ++t) {
      for (int h = 0; h < p.n_head; ++h) {
        const int64_t pos = pos0 + t;
        const int64_t j0 = p.n_swa > 0 ? std::max<int64_t>(0, pos - p.n_swa + 1) : 0;  // first key
        const int hk = h / group;
        const float* qh = q + (t * p.n_head + h) * p.head_dim_k;
        for (int64_t j = j0; j <= pos; ++j) {
          const float* kj = cache.k_row(layer, j) + hk * p.head_dim_k;
          float s = 0;
          for (int d = 0; d < p.head_dim_k; ++d) s += qh[d] * kj[d];
          score[size_t(j - j0)] = s * p.scale;
        }
        if (p.sinks) softmax_with_sink(score.data(), pos + 1 - j0, p.sinks[h]);
        else cpu::softmax(score.data(), pos + 1 - j0);
        float* o = out + (t * p.n_head + h) * p.head_dim_v;
        std::fill(o, o + p.head_dim_v, 0.0f);
        for (int64_t j = j0; j <= pos; ++j) {
          const float* vj = cache.v_row(layer, j) + hk * p.head_dim_v;
          const float w = score[size_t(j - j0)];
          for (int d = 0; d < p.head_dim_v; ++d) o[d] += w * vj[d];
        }
      }
    }
  }
}

void embed(const Model& m, const int32_t* tokens, int64_t n_tok, float* x) {
  const int64_t E = m.hparams().n_embd;
  for (int64_t t = 0; t < n_tok; ++t) cpu::get_row(m.tok_embd, tokens[t], x + t * E);
}

void rms_norm_rows(const float* x, const Weight& w, int64_t n_tok, int64_t n, float eps, float* out) {
  for (int64_t t = 0; t < n_tok; ++t) cpu::rms_norm(x + t * n, f32(w), n, eps, out + t * n);
}

void gqa_attention(const cpu::CpuBackend& be, const HParams& hp, const LayerWeights& l,
                   KvCache& cache, int il, const float* h, int64_t n_tok, int64_t pos0, float* y) {
  const int64_t E = hp.n_embd, H = hp.n_head, HKV = hp.n_head_kv, DK = hp.head_dim_k,
                DV = hp.head_dim_v;
  std::vector<float> q(size_t(n_tok * H * DK)), k(size_t(n_tok * HKV * DK)),
      v(size_t(n_tok * HKV * DV)), attn(size_t(n_tok * H * DV));
  be.matmul(l.wq, h, n_tok, q.data());
  be.matmul(l.wk, h, n_tok, k.data());
  be.matmul(l.wv, h, n_tok, v.data());
  add_bias(q.data(), l.bq, n_tok, H * DK);
  add_bias(k.data(), l.bk, n_tok, HKV * DK);
  add_bias(v.data(), l.bv, n_tok, HKV * DV);
  for (int64_t t = 0; t < n_tok; ++t) {
    float* qt = &q[size_t(t * H * DK)];
    float* kt = &k[size_t(t * HKV * DK)];
    if (l.q_norm) {
      rms_norm_rows(qt, l.q_norm, H, DK, hp.eps, qt);
      rms_norm_rows(kt, l.k_norm, HKV, DK, hp.eps, kt);
    }
    cpu::rope(qt, int(H), int(DK), pos0 + t, hp.rope);
    cpu::rope(kt, int(HKV), int(DK), pos0 + t, hp.rope);
    std::copy_n(kt, HKV * DK, cache.k_row(il, pos0 + t));
    std::copy_n(&v[size_t(t * HKV * DV)], HKV * DV, cache.v_row(il, pos0 + t));
  }
  const AttentionParams ap{.n_head = hp.n_head,
                           .n_head_kv = hp.n_head_kv,
                           .head_dim_k = hp.head_dim_k,
                           .head_dim_v = hp.head_dim_v,
                           .scale = hp.attn_scale,
                           .n_swa = hp.window(il),
                           .sinks = f32(l.attn_sinks)};
  attention_gqa(ap, cache, il, q.data(), n_tok, pos0, attn.data());
  be.matmul(l.wo, attn.data(), n_tok, y);
  add_bias(y, l.bo, n_tok, E);
}

void add_bias(float* x, const Weight& b, int64_t n_tok, int64_t n) {
  if (!b) return;
  for (int64_t t = 0; t < n_tok; ++t) cpu::add(x + t * n, f32(b), n);
}

}  // namespace strata
