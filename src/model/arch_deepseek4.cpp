// deepseek4 (DeepSeek-V4-Flash), as llama.cpp computes it (../shared/fixtures/README.md, its
// deepseek4 row and semantics):
//  - the residual is hc_streams streams mixed around every sublayer by hyper-connections (a
//    Sinkhorn-normalised mixing matrix per token);
//  - attention has one head that is both key and value, NORM RoPE on its last rope channels, per-head
//    sinks and a sliding window; compressed layers also attend to rows that pool blocks of 4 tokens
//    (chosen per query by the lightning indexer) or of 128 tokens; the head outputs are rotated back
//    by the query's angle and projected by a grouped output LoRA;
//  - experts are scored by sqrt(softplus(z)); the first hash_layer_count layers take them from a
//    token-id table; SwiGLU with clamps; one shared expert.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "base/profiler.h"
#include "cpu/thread_pool.h"
#include "model/blocks.h"
#include "model/forward.h"
#include "model/hyper_connections.h"

namespace strata {

namespace {

// Feeds token p's compressor values (a, s) [pool_width] into the ring and, when p ends a block,
// appends the block's row: per channel c < width, the softmax over the block's candidates of s
// pooling a (ratio 4: the previous block's 4 tokens on channel c, its own on width + c; block 0
// has no previous block), then RMSNorm(norm) and RoPE at the block's first position.
void compress_token(KvCache::Compressor& cp, int ratio, int64_t p, const float* a, const float* s, const Weight& norm,
                    const HParams& hp, const cpu::RopeParams& rope) {
  const int64_t PW = cp.pool_width, W = cp.width;
  const int64_t slot = p % cp.slots;
  std::copy(a, a + PW, &cp.ring_a[size_t(slot * PW)]);
  std::copy(s, s + PW, &cp.ring_s[size_t(slot * PW)]);
  if ((p + 1) % ratio != 0) return;
  const int64_t b = p / ratio;
  float* row = &cp.rows[size_t(b * W)];
  const int64_t first = b * ratio;
  for (int64_t c = 0; c < W; ++c) {
    // candidates: (token q, channel offset); ratio 4 overlaps the previous block
    float mx = -INFINITY;
    auto each = [&](auto&& fn) {
      if (ratio == 4) {
        if (b > 0)
          for (int64_t q = first - 4; q < first; ++q) fn(q % cp.slots, c);
        for (int64_t q = first; q < first + 4; ++q) fn(q % cp.slots, W + c);
      } else {
        for (int64_t q = first; q < first + ratio; ++q) fn(q % cp.slots, c);
      }
    };
    each([&](int64_t sl, int64_t ch) { mx = std::max(mx, cp.ring_s[size_t(sl * PW + ch)]); });
    double num = 0, den = 0;
    each([&](int64_t sl, int64_t ch) {
      const double e = std::exp(double(cp.ring_s[size_t(sl * PW + ch)] - mx));
      den += e;
      num += e * cp.ring_a[size_t(sl * PW + ch)];
    });
    row[c] = float(num / den);
  }
  cpu::rms_norm(row, f32(norm), W, hp.eps, row);
  rope_tail(row, 1, W, first, rope);
}

// Runs a compressor over a span's tokens h [n][E] at positions pos0..: a = kv h, s = gate h + ape.
void compress_span(const Backend& be, const HParams& hp, KvCache::Compressor& cp, int ratio, const Weight& kv,
                   const Weight& gate, const Weight& ape, const Weight& norm, const float* h, int64_t n, int64_t pos0,
                   const cpu::RopeParams& rope) {
  const int64_t PW = cp.pool_width;
  std::vector<float> a(size_t(n * PW)), s(size_t(n * PW)), ape_row(static_cast<size_t>(PW));
  be.matmul(kv, h, n, a.data());
  be.matmul(gate, h, n, s.data());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = pos0 + i;
    cpu::get_row(ape, p % ratio, ape_row.data());
    for (int64_t c = 0; c < PW; ++c) s[size_t(i * PW + c)] += ape_row[size_t(c)];
    compress_token(cp, ratio, p, &a[size_t(i * PW)], &s[size_t(i * PW)], norm, hp, rope);
  }
}

// The attention sublayer on the normalised input h [n_tok][E] into y [n_tok][E].
void attention(const Backend& be, const HParams& hp, const LayerWeights& l, std::span<const SeqSpan> seqs,
               int il, const float* h, int64_t n_tok, float* y) {
  const int64_t E = hp.n_embd, H = hp.n_head, D = hp.head_dim_k, Q = hp.q_lora_rank;
  const int ratio = hp.compress_ratio[size_t(il)];
  const cpu::RopeParams& rope = hp.layer_rope(il);
  std::vector<float> qr(size_t(n_tok * Q)), q(size_t(n_tok * H * D)), kv(size_t(n_tok * D));
  be.matmul(l.wq_a, h, n_tok, qr.data());
  rms_norm_rows(qr.data(), l.q_a_norm, n_tok, Q, hp.eps, qr.data());
  be.matmul(l.wq_b, qr.data(), n_tok, q.data());
  rms_norm_plain(q.data(), n_tok * H, D, hp.eps);  // every head, no weight
  be.matmul(l.wkv, h, n_tok, kv.data());
  rms_norm_rows(kv.data(), l.kv_a_norm, n_tok, D, hp.eps, kv.data());

  // the lightning indexer's queries and head weights (ratio-4 layers)
  const int64_t IH = hp.n_idx_head, ID = hp.idx_head_dim;
  std::vector<float> qi, wi;
  if (ratio == 4) {
    qi.resize(size_t(n_tok * IH * ID));
    wi.resize(size_t(n_tok * IH));
    be.matmul(l.idx_q_b, qr.data(), n_tok, qi.data());
    be.matmul(l.idx_proj, h, n_tok, wi.data());
    const float inv = 1.0f / std::sqrt(float(ID * IH));
    for (float& w : wi) w *= inv;
  }

  std::vector<KvCache*> tok_cache(static_cast<size_t>(n_tok));
  std::vector<int64_t> tok_pos(static_cast<size_t>(n_tok));
  for (int64_t t = 0; const SeqSpan& seq : seqs) {
    for (int64_t j = 0; j < seq.n_tok; ++j, ++t) {
      const int64_t pos = seq.pos0 + j;
      tok_cache[size_t(t)] = seq.cache;
      tok_pos[size_t(t)] = pos;
      rope_tail(&q[size_t(t * H * D)], H, D, pos, rope);
      rope_tail(&kv[size_t(t * D)], 1, D, pos, rope);
      if (ratio == 4) rope_tail(&qi[size_t(t * IH * ID)], IH, ID, pos, rope);
      std::copy_n(&kv[size_t(t * D)], D, seq.cache->k_row(il, pos));
    }
    if (ratio > 0) {  // the span's completed blocks, in order, before any of its queries
      KvCache::CompressedLayer& cl = seq.cache->compressed[size_t(il)];
      const float* hs = h + (t - seq.n_tok) * E;
      compress_span(be, hp, cl.attn, ratio, l.comp_kv, l.comp_gate, l.comp_ape, l.comp_norm, hs, seq.n_tok, seq.pos0,
                    rope);
      if (ratio == 4)
        compress_span(be, hp, cl.index, ratio, l.idx_comp_kv, l.idx_comp_gate, l.idx_comp_ape, l.idx_comp_norm, hs,
                      seq.n_tok, seq.pos0, rope);
    }
  }

  std::vector<float> attn(size_t(n_tok * H * D));
  const float* sinks = f32(l.attn_sinks);
  const int64_t n_swa = hp.n_swa;
  cpu::compute_pool().run(n_tok, [&](int64_t t, int) {
    thread_local std::vector<const float*> keys;
    thread_local std::vector<float> score, block_score;
    thread_local std::vector<int64_t> blocks;
    const int64_t pos = tok_pos[size_t(t)];
    KvCache& cache = *tok_cache[size_t(t)];
    keys.clear();
    for (int64_t j = std::max<int64_t>(0, pos - n_swa + 1); j <= pos; ++j) keys.push_back(cache.k_row(il, j));
    if (ratio > 0) {
      const KvCache::CompressedLayer& cl = cache.compressed[size_t(il)];
      const int64_t nb = (pos + 1) / ratio;  // blocks whose last token is at or before pos
      blocks.resize(size_t(nb));
      std::iota(blocks.begin(), blocks.end(), 0);
      if (ratio == 4 && nb > hp.idx_top_k) {
        // score(i, b) = sum_h relu(qi_h . k_b) w_h; the top_k best blocks
        block_score.resize(size_t(nb));
        for (int64_t b = 0; b < nb; ++b) {
          const float* kb = &cl.index.rows[size_t(b * ID)];
          float sc = 0;
          for (int64_t hh = 0; hh < IH; ++hh)
            sc += std::max(0.0f, cpu::dot_f32(&qi[size_t((t * IH + hh) * ID)], kb, ID)) * wi[size_t(t * IH + hh)];
          block_score[size_t(b)] = sc;
        }
        std::partial_sort(blocks.begin(), blocks.begin() + hp.idx_top_k, blocks.end(), [&](int64_t a, int64_t b) {
          return block_score[size_t(a)] > block_score[size_t(b)] || (block_score[size_t(a)] == block_score[size_t(b)] && a < b);
        });
        blocks.resize(size_t(hp.idx_top_k));
      }
      for (int64_t b : blocks) keys.push_back(&cl.attn.rows[size_t(b * D)]);
    }
    const int64_t nk = int64_t(keys.size());
    score.resize(size_t(nk));
    for (int64_t hh = 0; hh < H; ++hh) {
      const float* qh = &q[size_t((t * H + hh) * D)];
      float mx = sinks[hh];
      for (int64_t j = 0; j < nk; ++j) {
        score[size_t(j)] = cpu::dot_f32(qh, keys[size_t(j)], D) * hp.attn_scale;
        mx = std::max(mx, score[size_t(j)]);
      }
      float sum = std::exp(sinks[hh] - mx);  // the sink: a key with no value
      for (int64_t j = 0; j < nk; ++j) sum += score[size_t(j)] = std::exp(score[size_t(j)] - mx);
      float* o = &attn[size_t((t * H + hh) * D)];
      std::fill(o, o + D, 0.0f);
      for (int64_t j = 0; j < nk; ++j) {
        const float w = score[size_t(j)] / sum;
        const float* kj = keys[size_t(j)];
        for (int64_t i = 0; i < D; ++i) o[i] += w * kj[i];
      }
    }
    rope_tail(&attn[size_t(t * H * D)], H, D, -pos, rope);  // back by the query's own angle
  });

  // grouped output LoRA: group g's heads times rows [g OL, (g+1) OL) of wo_a, then wo_b
  const int64_t G = hp.o_groups, OL = hp.o_lora_rank, GW = H * D / G;
  std::vector<float> in(size_t(n_tok * GW)), part(size_t(n_tok * OL)), lora(size_t(n_tok * G * OL));
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t t = 0; t < n_tok; ++t) std::copy_n(&attn[size_t(t * H * D + g * GW)], GW, &in[size_t(t * GW)]);
    be.matmul(l.wo_a.rows(g * OL, OL), in.data(), n_tok, part.data());
    for (int64_t t = 0; t < n_tok; ++t) std::copy_n(&part[size_t(t * OL)], OL, &lora[size_t(t * G * OL + g * OL)]);
  }
  be.matmul(l.wo_b, lora.data(), n_tok, y);
}

}  // namespace

void init_deepseek4_cache(const Model& m, int n_ctx, KvCache& cache) {
  const HParams& hp = m.hparams();
  // the raw rows (one K = V head per layer; every position is kept, the window is applied when
  // reading) and each compressed layer's compressors
  cache.init(hp.n_layer, n_ctx, hp.head_dim_k, 0);
  cache.compressed.assign(size_t(hp.n_layer), {});
  for (int il = 0; il < hp.n_layer; ++il) {
    const int r = hp.compress_ratio[size_t(il)];
    if (r == 0) continue;
    KvCache::CompressedLayer& cl = cache.compressed[size_t(il)];
    cl.ratio = r;
    auto setup = [&](KvCache::Compressor& c, int width) {
      c.width = width;
      c.pool_width = r == 4 ? 2 * width : width;
      c.slots = r == 4 ? 2 * r : r;
      c.ring_a.assign(size_t(c.slots * c.pool_width), 0.0f);
      c.ring_s.assign(size_t(c.slots * c.pool_width), 0.0f);
      c.rows.assign(size_t(n_ctx / r + 1) * size_t(width), 0.0f);
    };
    setup(cl.attn, hp.head_dim_k);
    if (r == 4) setup(cl.index, hp.idx_head_dim);
  }
}

void forward_deepseek4(const Model& m, const Exec& ex, std::span<const SeqSpan> seqs, const int32_t* tokens,
                       bool all_logits, float* logits) {
  const HParams& hp = m.hparams();
  const Backend& be = ex.be;
  const int64_t n_tok = batch_tokens(seqs);
  const int64_t E = hp.n_embd, S = hp.hc_streams;
  std::vector<float> X(size_t(n_tok * S * E)), x(size_t(n_tok * E)), h(size_t(n_tok * E)), y(size_t(n_tok * E));

  // hash-routed layers choose their experts from the token ids alone: a tier's reads of them
  // start now, before the first layer is computed
  look_ahead_hashed(ex, m, tokens, n_tok);

  embed(m, tokens, n_tok, x.data());
  for (int64_t t = 0; t < n_tok; ++t)
    for (int64_t s = 0; s < S; ++s) std::copy_n(&x[size_t(t * E)], E, &X[size_t((t * S + s) * E)]);

  for (int il = 0; il < hp.n_layer; ++il) {
    const LayerWeights& l = m.layers[size_t(il)];
    {
      prof::Span span(prof::Part::attention, il);
      const HcMix mix = hc_mix(be, hp, l.hc_attn_fn, l.hc_attn_base, l.hc_attn_scale, X.data(), n_tok);
      hc_pre(mix, X.data(), n_tok, S, E, x.data());
      rms_norm_rows(x.data(), l.attn_norm, n_tok, E, hp.eps, h.data());
      attention(be, hp, l, seqs, il, h.data(), n_tok, y.data());
      hc_post(mix, y.data(), n_tok, S, E, X.data());
    }
    HcMix mix;
    {
      prof::Span span(prof::Part::router, il);
      mix = hc_mix(be, hp, l.hc_ffn_fn, l.hc_ffn_base, l.hc_ffn_scale, X.data(), n_tok);
      hc_pre(mix, X.data(), n_tok, S, E, x.data());
    }
    const GluParams glu{.kind = GluKind::silu_clamp, .limit = hp.clamp_exp[size_t(il)]};
    moe_block(ex, m, l, il, x.data(), n_tok, tokens, glu, h.data(), y.data(), /*host_norm=*/true);
    {
      prof::Span span(prof::Part::shared_ffn, il);
      SwigluOptions opt;
      opt.glu = {.kind = GluKind::silu_clamp, .limit = hp.clamp_shexp[size_t(il)]};
      be.swiglu_ffn(l.gate_shexp, l.up_shexp, l.down_shexp, h.data(), n_tok, nullptr, true, y.data(), opt);
    }
    hc_post(mix, y.data(), n_tok, S, E, X.data());
  }

  // head: the streams weighted into one row, then the final norm and the lm head
  std::vector<float> flat(X), w(size_t(n_tok * S));
  rms_norm_plain(flat.data(), n_tok, S * E, hp.eps);
  be.matmul(m.output_hc_fn, flat.data(), n_tok, w.data());
  const float* base = f32(m.output_hc_base);
  const float scale = f32(m.output_hc_scale)[0];
  for (int64_t t = 0; t < n_tok; ++t) {
    float* xt = &x[size_t(t * E)];
    std::fill(xt, xt + E, 0.0f);
    for (int64_t s = 0; s < S; ++s) {
      const float ws = sigmoid(w[size_t(t * S + s)] * scale + base[s]) + hp.hc_eps;
      const float* Xs = &X[size_t((t * S + s) * E)];
      for (int64_t i = 0; i < E; ++i) xt[i] += ws * Xs[i];
    }
  }
  output_head(m, be, x.data(), seqs, all_logits, logits);
}

}  // namespace strata
