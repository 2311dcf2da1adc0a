// deepseek41 (DeepSeek-V4.1-Flash) in ik_llama.cpp's GGUF dialect, as
// ../shared/fixtures/models/deepseek41/README.md describes it:
//  - Engram before the whole block on its layers: each token's hashed n-gram rows (model/engram.h)
//    projected to one key per hyper-connection stream and one value for all; each stream adds the
//    value times its gate, sigmoid(signed sqrt(normalised stream . key / sqrt(n_embd)));
//  - lagged hyper-connections: a sublayer collapses the streams with the pre mix of the sublayer
//    before it (layer 0: stream 0), and the last FFN's pre mix collapses them for the head;
//  - deepseek4's attention (one K = V head, tail RoPE, sinks, a window, grouped output LoRA)
//    without the q heads' RMSNorm, and compressed attention shared across layers: KV sources pool
//    `ratio` tokens without overlap (ratio 1: a plain projection), index sources choose the top-k
//    compressed rows with the lightning indexer over a key owner's keys, and the other compressed
//    layers reuse the last source's rows and choice (HParams::kv_source ...);
//  - deepseek4's experts (sqrt-softplus scores, clamped SwiGLU, one shared expert), no hash layers.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "base/profiler.h"
#include "cpu/thread_pool.h"
#include "model/blocks.h"
#include "model/engram.h"
#include "model/forward.h"
#include "model/hyper_connections.h"

namespace strata {

namespace {

// The Engram rows of a batch: for each Engram slot, the row ids of every token [n_tok][per].
using EngramBatch = std::vector<std::vector<int64_t>>;

// Records the batch's compressed ids in their caches and hashes each token's n-grams.
EngramBatch engram_rows(const HParams& hp, std::span<const SeqSpan> seqs, const int32_t* tokens, int64_t n_tok) {
  const EngramParams& e = hp.engram;
  if (e.layers.empty()) return {};  // a file without Engram layers: no ids kept, nothing hashed
  const int64_t per = e.rows_per_token();
  EngramBatch rows(e.layers.size(), std::vector<int64_t>(size_t(n_tok * per)));
  for (int64_t t = 0; const SeqSpan& seq : seqs) {
    int32_t* ids = seq.cache->engram_ids.data();
    for (int64_t j = 0; j < seq.n_tok; ++j) ids[seq.pos0 + j] = e.token_map[size_t(tokens[t + j])];
    for (int64_t j = 0; j < seq.n_tok; ++j, ++t)
      for (size_t s = 0; s < rows.size(); ++s) engram_row_ids(e, int(s), ids, seq.pos0 + j, &rows[s][size_t(t * per)]);
  }
  return rows;
}

// Layer il's Engram on the streams X [n_tok][S][E], in place.
void engram(const Exec& ex, const HParams& hp, const LayerWeights& l, int il, std::span<const int64_t> rows,
            int64_t n_tok, float* X) {
  const int64_t E = hp.n_embd, S = hp.hc_streams, KW = int64_t(hp.engram.rows_per_token()) * hp.engram.key_length;
  std::vector<float> g(size_t(n_tok * KW)), kv(size_t(n_tok * (S + 1) * E)), qn(static_cast<size_t>(E)),
      kn(static_cast<size_t>(E));
  // a failed read leaves the rows as they are: the tier reports the error for this pass
  if (!ex.engram.gather(l, il, rows, g.data())) return;
  ex.be.matmul(l.engram_wkv, g.data(), n_tok, kv.data());
  const float* wq = f32(l.engram_q);
  const float* wk = f32(l.engram_k);
  const float inv = 1.0f / std::sqrt(float(E));
  for (int64_t t = 0; t < n_tok; ++t) {
    const float* kvt = &kv[size_t(t * (S + 1) * E)];
    const float* value = kvt + S * E;
    for (int64_t s = 0; s < S; ++s) {
      float* Xs = X + (t * S + s) * E;
      cpu::rms_norm(Xs, wq + s * E, E, hp.eps, qn.data());
      cpu::rms_norm(kvt + s * E, wk + s * E, E, hp.eps, kn.data());
      const float dot = cpu::dot_f32(qn.data(), kn.data(), E) * inv;
      const float gate = sigmoid(std::copysign(std::sqrt(std::max(std::abs(dot), 1e-6f)), dot));
      for (int64_t i = 0; i < E; ++i) Xs[i] += gate * value[i];
    }
  }
}

// Runs a KV source's compressor over a span's tokens h [n][E] at positions pos0..: a = kv h,
// s = gate h (none for ratio 1). When token p ends a block, the block's row is per channel the
// softmax over its `ratio` tokens of s pooling a, RMS-normalised (the latent), then roped at the
// block's first position; a key owner also derives the block's index key from the latent:
// RMSNorm(idx_k latent), roped there too.
void compress_span(const Backend& be, const HParams& hp, const LayerWeights& l, KvCache::CompressedLayer& cl,
                   const float* h, int64_t n, int64_t pos0, const cpu::RopeParams& rope) {
  KvCache::Compressor& cp = cl.attn;
  const int ratio = cl.ratio;
  const int64_t W = cp.width;
  std::vector<float> a(size_t(n * W)), s;
  be.matmul(l.comp_kv, h, n, a.data());
  if (l.comp_gate) {
    s.resize(size_t(n * W));
    be.matmul(l.comp_gate, h, n, s.data());
  }
  std::vector<float> latents;  // the completed blocks' latents, for the index keys
  std::vector<int64_t> blocks;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = pos0 + i, slot = p % cp.slots;
    std::copy_n(&a[size_t(i * W)], W, &cp.ring_a[size_t(slot * W)]);
    if (!s.empty()) std::copy_n(&s[size_t(i * W)], W, &cp.ring_s[size_t(slot * W)]);
    if ((p + 1) % ratio != 0) continue;
    const int64_t b = p / ratio, first = b * ratio;
    float* row = &cp.rows[size_t(b * W)];
    for (int64_t c = 0; c < W; ++c) {
      float mx = -INFINITY;
      for (int64_t q = first; q <= p; ++q) mx = std::max(mx, cp.ring_s[size_t((q % cp.slots) * W + c)]);
      double num = 0, den = 0;
      for (int64_t q = first; q <= p; ++q) {
        const double w = std::exp(double(cp.ring_s[size_t((q % cp.slots) * W + c)] - mx));
        den += w;
        num += w * cp.ring_a[size_t((q % cp.slots) * W + c)];
      }
      row[c] = float(num / den);
    }
    cpu::rms_norm(row, f32(l.comp_norm), W, hp.eps, row);
    if (l.idx_k) {
      latents.insert(latents.end(), row, row + W);
      blocks.push_back(b);
    }
    rope_tail(row, 1, W, first, rope);
  }
  if (blocks.empty()) return;
  const int64_t nb = int64_t(blocks.size()), ID = cl.index.width;
  std::vector<float> keys(size_t(nb * ID));
  be.matmul(l.idx_k, latents.data(), nb, keys.data());
  rms_norm_rows(keys.data(), l.idx_k_norm, nb, ID, hp.eps, keys.data());
  for (int64_t i = 0; i < nb; ++i) {
    float* key = &cl.index.rows[size_t(blocks[size_t(i)] * ID)];
    std::copy_n(&keys[size_t(i * ID)], ID, key);
    rope_tail(key, 1, ID, blocks[size_t(i)] * ratio, rope);
  }
}

// Row b of a source layer's compressed rows (width w) as seen from position pos: a block that
// has not completed by pos reads as zeros (a reader whose ratio is finer than its source's sees
// more blocks than the source has pooled).
const float* source_row(const KvCache::Compressor& c, int ratio, int64_t b, int64_t pos, const float* zeros) {
  return b < (pos + 1) / ratio ? &c.rows[size_t(b * c.width)] : zeros;
}

// The attention sublayer of layer il on the normalised input h [n_tok][E] into y [n_tok][E];
// topk [n_tok] holds the compressed blocks each token chose at the last index source (this
// layer's choice when it is one).
void attention(const Backend& be, const HParams& hp, const LayerWeights& l, std::span<const SeqSpan> seqs, int il,
               const float* h, int64_t n_tok, std::vector<std::vector<int64_t>>& topk, float* y) {
  const int64_t E = hp.n_embd, H = hp.n_head, D = hp.head_dim_k, Q = hp.q_lora_rank;
  const int ratio = hp.compress_ratio[size_t(il)];
  const cpu::RopeParams& rope = hp.layer_rope(il);
  std::vector<float> qr(size_t(n_tok * Q)), q(size_t(n_tok * H * D)), kv(size_t(n_tok * D));
  be.matmul(l.wq_a, h, n_tok, qr.data());
  rms_norm_rows(qr.data(), l.q_a_norm, n_tok, Q, hp.eps, qr.data());
  be.matmul(l.wq_b, qr.data(), n_tok, q.data());
  be.matmul(l.wkv, h, n_tok, kv.data());
  rms_norm_rows(kv.data(), l.kv_a_norm, n_tok, D, hp.eps, kv.data());

  // an index source's lightning-indexer queries and head weights
  const bool chooses = ratio > 0 && hp.topk_source[size_t(il)] == il;
  const int64_t IH = hp.n_idx_head, ID = hp.idx_head_dim;
  std::vector<float> qi, wi;
  if (chooses) {
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
      if (chooses) rope_tail(&qi[size_t(t * IH * ID)], IH, ID, pos, rope);
      std::copy_n(&kv[size_t(t * D)], D, seq.cache->k_row(il, pos));
    }
    if (ratio > 0 && hp.kv_source[size_t(il)] == il)  // the span's completed blocks, before any query
      compress_span(be, hp, l, seq.cache->compressed[size_t(il)], h + (t - seq.n_tok) * E, seq.n_tok, seq.pos0,
                    rope);
  }

  std::vector<float> attn(size_t(n_tok * H * D));
  const float* sinks = f32(l.attn_sinks);
  const std::vector<float> zeros(size_t(std::max(D, ID)), 0.0f);
  cpu::compute_pool().run(n_tok, [&](int64_t t, int) {
    thread_local std::vector<const float*> keys;
    thread_local std::vector<float> score, block_score;
    const int64_t pos = tok_pos[size_t(t)];
    KvCache& cache = *tok_cache[size_t(t)];
    keys.clear();
    for (int64_t j = std::max<int64_t>(0, pos - hp.n_swa + 1); j <= pos; ++j) keys.push_back(cache.k_row(il, j));
    if (ratio > 0) {
      const int64_t nb = (pos + 1) / ratio;  // the blocks this layer's ratio makes visible at pos
      std::vector<int64_t>& chosen = topk[size_t(t)];
      if (chooses) {
        chosen.resize(size_t(nb));
        std::iota(chosen.begin(), chosen.end(), 0);
        if (nb > hp.idx_top_k) {
          // score(b) = sum_h relu(qi_h . k_b) w_h over the key owner's index keys; the top_k best
          const int owner = hp.key_source[size_t(il)];
          const KvCache::CompressedLayer& ko = cache.compressed[size_t(owner)];
          block_score.resize(size_t(nb));
          for (int64_t b = 0; b < nb; ++b) {
            const float* kb = source_row(ko.index, ko.ratio, b, pos, zeros.data());
            float sc = 0;
            for (int64_t hh = 0; hh < IH; ++hh)
              sc += std::max(0.0f, cpu::dot_f32(&qi[size_t((t * IH + hh) * ID)], kb, ID)) * wi[size_t(t * IH + hh)];
            block_score[size_t(b)] = sc;
          }
          std::partial_sort(chosen.begin(), chosen.begin() + hp.idx_top_k, chosen.end(), [&](int64_t a, int64_t b) {
            return block_score[size_t(a)] > block_score[size_t(b)] ||
                   (block_score[size_t(a)] == block_score[size_t(b)] && a < b);
          });
          chosen.resize(size_t(hp.idx_top_k));
        }
      }
      const KvCache::CompressedLayer& src = cache.compressed[size_t(hp.kv_source[size_t(il)])];
      for (int64_t b : chosen)
        if (b < nb) keys.push_back(source_row(src.attn, src.ratio, b, pos, zeros.data()));
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

void init_deepseek41_cache(const Model& m, int n_ctx, KvCache& cache) {
  const HParams& hp = m.hparams();
  // the raw K = V row of every layer and position (the window is applied when reading); each KV
  // source's compressor (a ring of its open block's tokens, and a row per block) and each key
  // owner's index keys (a row per block); the compressed id of every position for Engram
  cache.init(hp.n_layer, n_ctx, hp.head_dim_k, 0);
  cache.compressed.assign(size_t(hp.n_layer), {});
  for (int il = 0; il < hp.n_layer; ++il) {
    const int r = hp.compress_ratio[size_t(il)];
    if (r == 0) continue;
    KvCache::CompressedLayer& cl = cache.compressed[size_t(il)];
    cl.ratio = r;
    const size_t n_blocks = size_t(n_ctx / r + 1);
    if (hp.kv_source[size_t(il)] == il) {
      KvCache::Compressor& c = cl.attn;
      c.width = c.pool_width = hp.head_dim_k;
      // a block needs only its own tokens, but the ring keeps at least 16 (a multiple of the
      // ratio): speculative decoding rewinds up to `slots` tokens exactly (Session)
      c.slots = r >= 16 ? r : (16 + r - 1) / r * r;
      c.ring_a.assign(size_t(c.slots * c.pool_width), 0.0f);
      c.ring_s.assign(size_t(c.slots * c.pool_width), 0.0f);  // stays 0 at ratio 1 (no gate)
      c.rows.assign(n_blocks * size_t(c.width), 0.0f);
    }
    if (m.layers[size_t(il)].idx_k) {
      cl.index.width = hp.idx_head_dim;  // no ring: keys come from the attention rows' latents
      cl.index.rows.assign(n_blocks * size_t(cl.index.width), 0.0f);
    }
  }
  cache.engram_ids.assign(hp.engram.layers.empty() ? 0 : size_t(n_ctx), 0);
}

void forward_deepseek41(const Model& m, const Exec& ex, std::span<const SeqSpan> seqs, const int32_t* tokens,
                        bool all_logits, float* logits) {
  const HParams& hp = m.hparams();
  const Backend& be = ex.be;
  const int64_t n_tok = batch_tokens(seqs);
  const int64_t E = hp.n_embd, S = hp.hc_streams;
  std::vector<float> X(size_t(n_tok * S * E)), x(size_t(n_tok * E)), h(size_t(n_tok * E)), y(size_t(n_tok * E));

  // Engram rows depend on the token ids alone: the tier has every layer's rows of the batch
  // before the first layer runs
  const EngramBatch rows = engram_rows(hp, seqs, tokens, n_tok);
  for (size_t s = 0; s < rows.size(); ++s) ex.engram.prefetch(hp.engram.layers[s], rows[s]);

  embed(m, tokens, n_tok, x.data());
  for (int64_t t = 0; t < n_tok; ++t)
    for (int64_t s = 0; s < S; ++s) std::copy_n(&x[size_t(t * E)], E, &X[size_t((t * S + s) * E)]);

  // the lagged mix: each sublayer collapses the streams with the previous sublayer's pre weights
  HcMix prev;
  prev.pre.assign(size_t(n_tok * S), 0.0f);
  for (int64_t t = 0; t < n_tok; ++t) prev.pre[size_t(t * S)] = 1.0f;  // layer 0: stream 0
  std::vector<std::vector<int64_t>> topk(static_cast<size_t>(n_tok));
  for (int il = 0; il < hp.n_layer; ++il) {
    const LayerWeights& l = m.layers[size_t(il)];
    if (const int slot = hp.engram.slot(il); slot >= 0) {
      prof::Span span(prof::Part::engram, il);
      engram(ex, hp, l, il, rows[size_t(slot)], n_tok, X.data());
    }
    {
      prof::Span span(prof::Part::attention, il);
      HcMix mix = hc_mix(be, hp, l.hc_attn_fn, l.hc_attn_base, l.hc_attn_scale, X.data(), n_tok);
      hc_pre(prev, X.data(), n_tok, S, E, x.data());
      rms_norm_rows(x.data(), l.attn_norm, n_tok, E, hp.eps, h.data());
      attention(be, hp, l, seqs, il, h.data(), n_tok, topk, y.data());
      hc_post(mix, y.data(), n_tok, S, E, X.data());
      prev = std::move(mix);
    }
    HcMix mix;
    {
      prof::Span span(prof::Part::router, il);
      mix = hc_mix(be, hp, l.hc_ffn_fn, l.hc_ffn_base, l.hc_ffn_scale, X.data(), n_tok);
      hc_pre(prev, X.data(), n_tok, S, E, x.data());
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
    prev = std::move(mix);
  }

  // head: the last FFN's pre mix collapses the streams, then the final norm and the lm head
  hc_pre(prev, X.data(), n_tok, S, E, x.data());
  output_head(m, be, x.data(), seqs, all_logits, logits);
}

}  // namespace strata
