// gpt-oss: pre-norm blocks of GQA attention with biases and per-head sinks (sliding-window on the
// even layers, full on the odd ones; NEOX RoPE with YaRN, whose magnitude scales q and k) and a
// routed-expert FFN (router with bias, top-k of the logits, softmax over the chosen; experts with
// biases and the clamped swiglu_oai). See ../shared/fixtures/README.md (gpt-oss).
#include <vector>

#include "model/blocks.h"
#include "model/forward.h"

namespace strata {

void forward_gpt_oss(const Model& m, const cpu::CpuBackend& be, KvCache& cache,
                     const int32_t* tokens, int64_t n_tok, int64_t pos0, bool all_logits,
                     float* logits) {
  const HParams& hp = m.hparams();
  const int64_t E = hp.n_embd, H = hp.n_head, HKV = hp.n_head_kv, DK = hp.head_dim_k,
                DV = hp.head_dim_v;
  std::vector<float> x(size_t(n_tok * E)), h(size_t(n_tok * E)), y(size_t(n_tok * E));
  std::vector<float> q(size_t(n_tok * H * DK)), k(size_t(n_tok * HKV * DK)),
      v(size_t(n_tok * HKV * DV)), attn(size_t(n_tok * H * DV));

  // embeddings
  for (int64_t t = 0; t < n_tok; ++t) cpu::get_row(m.tok_embd, tokens[t], x.data() + t * E);

  for (int il = 0; il < hp.n_layer; ++il) {
    const LayerWeights& l = m.layers[size_t(il)];

    // attention: q, k, v with biases; RoPE; sinks; a sliding window on the even layers
    for (int64_t t = 0; t < n_tok; ++t)
      cpu::rms_norm(&x[t * E], f32(l.attn_norm), E, hp.eps, &h[t * E]);
    be.matmul(l.wq, h.data(), n_tok, q.data());
    be.matmul(l.wk, h.data(), n_tok, k.data());
    be.matmul(l.wv, h.data(), n_tok, v.data());
    add_bias(q.data(), l.bq, n_tok, H * DK);
    add_bias(k.data(), l.bk, n_tok, HKV * DK);
    add_bias(v.data(), l.bv, n_tok, HKV * DV);
    for (int64_t t = 0; t < n_tok; ++t) {
      float* kt = &k[t * HKV * DK];
      cpu::rope(&q[t * H * DK], int(H), int(DK), pos0 + t, hp.rope);
      cpu::rope(kt, int(HKV), int(DK), pos0 + t, hp.rope);
      std::copy_n(kt, HKV * DK, cache.k_row(il, pos0 + t));
      std::copy_n(&v[t * HKV * DV], HKV * DV, cache.v_row(il, pos0 + t));
    }
    const AttentionParams ap{.n_head = hp.n_head,
                             .n_head_kv = hp.n_head_kv,
                             .head_dim_k = hp.head_dim_k,
                             .head_dim_v = hp.head_dim_v,
                             .scale = hp.attn_scale,
                             .n_swa = hp.window(il),
                             .sinks = f32(l.attn_sinks)};
    attention_gqa(ap, cache, il, q.data(), n_tok, pos0, attn.data());
    be.matmul(l.wo, attn.data(), n_tok, y.data());
    add_bias(y.data(), l.bo, n_tok, E);
    cpu::add(x.data(), y.data(), n_tok * E);  // residual

    // routed experts
    for (int64_t t = 0; t < n_tok; ++t)
      cpu::rms_norm(&x[t * E], f32(l.ffn_norm), E, hp.eps, &h[t * E]);
    const Routing routing = route(be, hp, l, h.data(), n_tok);
    moe_ffn(be, l, routing, h.data(), n_tok, E, y.data(), hp.expert_glu);
    cpu::add(x.data(), y.data(), n_tok * E);  // residual
  }
  output_head(m, be, x.data(), n_tok, all_logits, logits);
}

}  // namespace strata
