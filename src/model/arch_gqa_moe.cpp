// qwen3moe, qwen2moe and llama with experts (Mixtral): pre-norm blocks of GQA attention and a
// routed-expert FFN. What differs between them is data the loader found: q/k biases (qwen2moe),
// per-head q/k RMSNorm (qwen3moe), a sigmoid-gated shared expert (qwen2moe), whether the top-k
// weights are renormalised, and the RoPE pairing (NEOX for qwen, NORM for llama).
#include <cmath>
#include <vector>

#include "model/blocks.h"
#include "model/forward.h"

namespace strata {

void forward_gqa_moe(const Model& m, const cpu::CpuBackend& be, KvCache& cache, const int32_t* tokens, int64_t n_tok,
                     int64_t pos0, bool all_logits, float* logits) {
  const HParams& hp = m.hparams();
  const int64_t E = hp.n_embd, H = hp.n_head, HKV = hp.n_head_kv, DK = hp.head_dim_k,
                DV = hp.head_dim_v;
  std::vector<float> x(size_t(n_tok * E)), h(size_t(n_tok * E)), y(size_t(n_tok * E));
  std::vector<float> q(size_t(n_tok * H * DK)), k(size_t(n_tok * HKV * DK)),
      v(size_t(n_tok * HKV * DV)), attn(size_t(n_tok * H * DV));

  // embeddings
  for (int64_t t = 0; t < n_tok; ++t) cpu::get_row(m.tok_embd, tokens[t], x.data() + t * E);

  const AttentionParams ap{.n_head = hp.n_head, .n_head_kv = hp.n_head_kv, .head_dim_k = hp.head_dim_k,
                           .head_dim_v = hp.head_dim_v, .scale = hp.attn_scale};
  for (int il = 0; il < hp.n_layer; ++il) {
    const LayerWeights& l = m.layers[size_t(il)];

    // attention
    for (int64_t t = 0; t < n_tok; ++t) cpu::rms_norm(&x[t * E], f32(l.attn_norm), E, hp.eps, &h[t * E]);
    be.matmul(l.wq, h.data(), n_tok, q.data());
    be.matmul(l.wk, h.data(), n_tok, k.data());
    be.matmul(l.wv, h.data(), n_tok, v.data());
    add_bias(q.data(), l.bq, n_tok, H * DK);
    add_bias(k.data(), l.bk, n_tok, HKV * DK);
    add_bias(v.data(), l.bv, n_tok, HKV * DV);
    for (int64_t t = 0; t < n_tok; ++t) {
      float* qt = &q[t * H * DK];
      float* kt = &k[t * HKV * DK];
      if (l.q_norm) {
        for (int64_t i = 0; i < H; ++i) cpu::rms_norm(qt + i * DK, f32(l.q_norm), DK, hp.eps, qt + i * DK);
        for (int64_t i = 0; i < HKV; ++i) cpu::rms_norm(kt + i * DK, f32(l.k_norm), DK, hp.eps, kt + i * DK);
      }
      cpu::rope(qt, int(H), int(DK), pos0 + t, hp.rope);
      cpu::rope(kt, int(HKV), int(DK), pos0 + t, hp.rope);
      std::copy_n(kt, HKV * DK, cache.k_row(il, pos0 + t));
      std::copy_n(&v[t * HKV * DV], HKV * DV, cache.v_row(il, pos0 + t));
    }
    attention_gqa(ap, cache, il, q.data(), n_tok, pos0, attn.data());
    be.matmul(l.wo, attn.data(), n_tok, y.data());
    add_bias(y.data(), l.bo, n_tok, E);
    cpu::add(x.data(), y.data(), n_tok * E);  // residual

    // routed experts (+ shared expert)
    for (int64_t t = 0; t < n_tok; ++t) cpu::rms_norm(&x[t * E], f32(l.ffn_norm), E, hp.eps, &h[t * E]);
    const Routing routing = route(be, hp, l, h.data(), n_tok);
    moe_ffn(be, l, routing, h.data(), n_tok, E, y.data());
    if (l.gate_shexp) {
      std::vector<float> gate(size_t(n_tok), 1.0f);
      if (l.gate_inp_shexp) {
        for (int64_t t = 0; t < n_tok; ++t) {
          float z = 0;
          for (int64_t i = 0; i < E; ++i) z += f32(l.gate_inp_shexp)[i] * h[size_t(t * E + i)];
          gate[size_t(t)] = 1.0f / (1.0f + std::exp(-z));
        }
      }
      swiglu_ffn(be, l.gate_shexp, l.up_shexp, l.down_shexp, h.data(), n_tok, gate.data(), true, y.data());
    }
    cpu::add(x.data(), y.data(), n_tok * E);  // residual
  }
  output_head(m, be, x.data(), n_tok, all_logits, logits);
}

void output_head(const Model& m, const cpu::CpuBackend& be, const float* x, int64_t n_tok, bool all_logits, float* logits) {
  const int64_t E = m.hparams().n_embd;
  const int64_t first = all_logits ? 0 : n_tok - 1;
  const int64_t n = n_tok - first;
  std::vector<float> h(size_t(n * E));
  for (int64_t t = 0; t < n; ++t)
    cpu::rms_norm(x + (first + t) * E, f32(m.output_norm), E, m.hparams().eps, &h[size_t(t * E)]);
  be.matmul(m.output, h.data(), n, logits);
}

void init_cache(const Model& m, int n_ctx, KvCache& cache) {
  const HParams& hp = m.hparams();
  if (hp.arch == Arch::deepseek2) {
    // MLA caches the normalised latent c and the roped shared k_pe: v is derived from c
    cache.init(hp.n_layer, n_ctx, hp.kv_lora_rank + hp.qk_rope, 0);
  } else {
    // qwen3moe, qwen2moe, llama, gpt-oss: every position of every layer, sliding-window layers
    // included (attention_gqa skips the rows outside the window)
    cache.init(hp.n_layer, n_ctx, hp.n_head_kv * hp.head_dim_k, hp.n_head_kv * hp.head_dim_v);
  }
}

}  // namespace strata
