// deepseek2 (DeepSeek-V2/V3/R1 and V2-Lite): multi-head latent attention, leading dense layers,
// shared experts, softmax or sigmoid (+ bias, group-limited) routing.
//
// MLA, as llama.cpp computes it (../shared/fixtures/README.md): per token, the cache keeps the
// normalised latent c (kv_lora) and the roped k_pe (qk_rope, shared by all heads). Head h's score
// against position j is (q_nope_h . W_kb[h]^T c_j + q_pe_h . k_pe_j) * scale, computed by first
// absorbing W_kb[h] into the query (q_c = W_kb[h] q_nope, kv_lora wide); its output is
// W_vb[h] (sum_j p_j c_j).
#include <algorithm>
#include <vector>

#include "base/profiler.h"
#include "model/blocks.h"
#include "model/forward.h"

namespace strata {

namespace {

// Gathers column block [off, off + w) of rows of stride `stride` into a dense [n][w] buffer.
void gather(const float* src, int64_t n, int64_t stride, int64_t off, int64_t w, float* dst) {
  for (int64_t t = 0; t < n; ++t) std::copy_n(src + t * stride + off, w, dst + t * w);
}
void scatter(const float* src, int64_t n, int64_t stride, int64_t off, int64_t w, float* dst) {
  for (int64_t t = 0; t < n; ++t) std::copy_n(src + t * w, w, dst + t * stride + off);
}

// MLA over a batch of spans, in chunks of kMlaChunk tokens (a chunk's absorbed queries are
// n_head x (kv_lora + rope) floats a token: 288 KiB for DeepSeek-V3): per head the absorbed
// projection W_kb runs once for the chunk's tokens, the scores of each token over its own
// sequence's cache (Backend::attention_mla, all heads at once), then W_vb per head.
constexpr int64_t kMlaChunk = 64;

void mla_attention(const Backend& be, const HParams& hp, const LayerWeights& l, std::span<const SeqSpan> seqs,
                   int il, const float* q, int64_t n_tok, float* out) {
  const int64_t H = hp.n_head, NOPE = hp.qk_nope, ROPE = hp.qk_rope, QK = NOPE + ROPE, R = hp.kv_lora_rank,
                W = R + ROPE, DV = hp.v_head;
  std::vector<float> qn, qc, qlat, ctx, ch, o;
  for (int64_t c0 = 0; c0 < n_tok; c0 += kMlaChunk) {
    const int64_t n = std::min(kMlaChunk, n_tok - c0);
    const float* qchunk = q + c0 * H * QK;
    qn.resize(size_t(n * NOPE));
    qc.resize(size_t(n * R));
    qlat.resize(size_t(n * H * W));
    ctx.resize(size_t(n * H * R));
    ch.resize(size_t(n * R));
    o.resize(size_t(n * DV));
    for (int64_t h = 0; h < H; ++h) {
      gather(qchunk, n, H * QK, h * QK, NOPE, qn.data());
      be.matmul(l.wk_b.slice(h), qn.data(), n, qc.data());  // absorbed query, kv_lora wide
      scatter(qc.data(), n, H * W, h * W, R, qlat.data());
      for (int64_t t = 0; t < n; ++t)
        std::copy_n(qchunk + t * H * QK + h * QK + NOPE, ROPE, &qlat[size_t((t * H + h) * W + R)]);
    }
    // each sequence's tokens of the chunk over its own cache
    int64_t first = 0;  // the batch index of the span's first token
    for (const SeqSpan& seq : seqs) {
      const int64_t lo = std::max(first, c0), hi = std::min(first + seq.n_tok, c0 + n);
      if (lo < hi)
        be.attention_mla(int(H), int(R), int(ROPE), hp.attn_scale, *seq.cache, il, &qlat[size_t((lo - c0) * H * W)],
                         hi - lo, seq.pos0 + (lo - first), &ctx[size_t((lo - c0) * H * R)]);
      first += seq.n_tok;
    }
    for (int64_t h = 0; h < H; ++h) {
      gather(ctx.data(), n, H * R, h * R, R, ch.data());
      be.matmul(l.wv_b.slice(h), ch.data(), n, o.data());
      scatter(o.data(), n, H * DV, h * DV, DV, out + c0 * H * DV);
    }
  }
}

}  // namespace

void deepseek2_block(const Model& m, const Exec& ex, std::span<const SeqSpan> seqs, int il,
                     const LayerWeights& l, float* x, int64_t n_tok, float* h, float* y, MlaScratch& scratch) {
  const HParams& hp = m.hparams();
  const int64_t E = hp.n_embd, H = hp.n_head, QK = hp.qk_nope + hp.qk_rope, R = hp.kv_lora_rank,
                ROPE = hp.qk_rope;
  const Backend& be = ex.be;
  const bool main_layer = il < hp.n_layer;  // not the nextn layer, which predicts no other layer
  // the attention's buffers, sized once per forward pass (a prefill's q is tens of MB)
  std::vector<float>& q = scratch.q;
  std::vector<float>& kv = scratch.kv;
  std::vector<float>& attn = scratch.attn;
  std::vector<float>& qa = scratch.qa;
  q.resize(size_t(n_tok * H * QK));
  kv.resize(size_t(n_tok * (R + ROPE)));
  attn.resize(size_t(n_tok * H * hp.v_head));
  qa.resize(hp.q_lora_rank > 0 ? size_t(n_tok * hp.q_lora_rank) : 0);

  // attention (MLA)
  {
    prof::Span span(prof::Part::attention, il);
    be.rms_norm_rows(x, l.attn_norm, n_tok, E, hp.eps, h);
    if (hp.q_lora_rank > 0) {
      const int64_t Q = hp.q_lora_rank;
      be.matmul(l.wq_a, h, n_tok, qa.data());
      be.rms_norm_rows(qa.data(), l.q_a_norm, n_tok, Q, hp.eps, qa.data());
      be.matmul(l.wq_b, qa.data(), n_tok, q.data());
    } else {
      be.matmul(l.wq, h, n_tok, q.data());
    }
    be.matmul(l.wkv_a_mqa, h, n_tok, kv.data());
    for (int64_t t = 0; const SeqSpan& seq : seqs) {
      for (int64_t j = 0; j < seq.n_tok; ++j, ++t) {
        const int64_t pos = seq.pos0 + j;
        float* kvt = &kv[t * (R + ROPE)];
        cpu::rms_norm(kvt, f32(l.kv_a_norm), R, hp.eps, kvt);  // latent c
        cpu::rope(kvt + R, 1, int(ROPE), pos, hp.rope);        // k_pe
        for (int64_t i = 0; i < H; ++i) cpu::rope(&q[(t * H + i) * QK + hp.qk_nope], 1, int(ROPE), pos, hp.rope);
        std::copy_n(kvt, R + ROPE, seq.cache->k_row(il, pos));
      }
    }
    mla_attention(be, hp, l, seqs, il, q.data(), n_tok, attn.data());
    be.matmul(l.wo, attn.data(), n_tok, y);
    be.add(x, y, n_tok * E);  // residual
  }

  // feed-forward: dense, or routed experts + shared experts
  if (!l.is_moe()) {
    if (main_layer) {  // the look-ahead reaches past the leading dense layers
      prof::Span span(prof::Part::router, il);
      look_ahead(ex, m, il, x, n_tok);
    }
    prof::Span span(prof::Part::shared_ffn, il);
    be.rms_norm_rows(x, l.ffn_norm, n_tok, E, hp.eps, h);
    be.swiglu_ffn(l.ffn_gate, l.ffn_up, l.ffn_down, h, n_tok, nullptr, false, y);
  } else {
    moe_block(ex, m, l, il, x, n_tok, nullptr, {}, h, y);
    if (l.gate_shexp) {
      prof::Span span(prof::Part::shared_ffn, il);
      be.swiglu_ffn(l.gate_shexp, l.up_shexp, l.down_shexp, h, n_tok, nullptr, true, y);
    }
  }
  be.add(x, y, n_tok * E);  // residual
}

void forward_deepseek2(const Model& m, const Exec& ex, std::span<const SeqSpan> seqs, const int32_t* tokens,
                       bool all_logits, float* logits, float* hidden) {
  const HParams& hp = m.hparams();
  const int64_t n_tok = batch_tokens(seqs);
  const int64_t E = hp.n_embd;
  std::vector<float> x(size_t(n_tok * E)), h(size_t(n_tok * E)), y(size_t(n_tok * E));
  MlaScratch scratch;
  embed(m, tokens, n_tok, x.data());
  for (int il = 0; il < hp.n_layer; ++il)
    deepseek2_block(m, ex, seqs, il, m.layers[size_t(il)], x.data(), n_tok, h.data(), y.data(), scratch);
  if (hidden != nullptr) std::copy(x.begin(), x.end(), hidden);
  output_head(m, ex.be, x.data(), seqs, all_logits, logits);
}

}  // namespace strata
