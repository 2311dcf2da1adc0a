// qwen3moe, qwen2moe, llama with experts (Mixtral) and gpt-oss: pre-norm blocks of GQA attention
// and a routed-expert FFN. What differs between them is data the loader found: q/k/v/o biases and
// per-head sinks with sliding windows (gpt-oss), per-head q/k RMSNorm (qwen3moe), a sigmoid-gated
// shared expert (qwen2moe), the router's rule (softmax over all, or over the chosen top-k logits
// with a bias: gpt-oss), the experts' activation (hp.expert_glu: silu, or gpt-oss's clamped
// swiglu_oai with expert biases) and the RoPE pairing (NEOX for qwen and gpt-oss, NORM for llama).
#include <cmath>
#include <vector>

#include "base/profiler.h"
#include "model/blocks.h"
#include "model/forward.h"

namespace strata {

int64_t batch_tokens(std::span<const SeqSpan> seqs) {
  int64_t n = 0;
  for (const SeqSpan& s : seqs) n += s.n_tok;
  return n;
}

void forward(const Model& m, const Exec& ex, std::span<const SeqSpan> seqs, const int32_t* tokens, bool all_logits,
             float* logits, float* hidden) {
  switch (m.hparams().arch) {
    case Arch::qwen3moe:
    case Arch::qwen2moe:
    case Arch::llama:
    case Arch::gpt_oss:
      forward_gqa_moe(m, ex, seqs, tokens, all_logits, logits, hidden);
      break;
    case Arch::deepseek2:
      forward_deepseek2(m, ex, seqs, tokens, all_logits, logits, hidden);
      break;
    case Arch::deepseek4:
      STRATA_CHECK(hidden == nullptr, "deepseek4's forward pass gives no hidden rows");
      forward_deepseek4(m, ex, seqs, tokens, all_logits, logits);
      break;
    case Arch::deepseek41:
      STRATA_CHECK(hidden == nullptr, "deepseek41's forward pass gives no hidden rows");
      forward_deepseek41(m, ex, seqs, tokens, all_logits, logits);
      break;
  }
}

void gqa_moe_block(const Model& m, const Exec& ex, std::span<const SeqSpan> seqs, int il,
                   const LayerWeights& l, float* x, int64_t n_tok, float* h, float* y) {
  const HParams& hp = m.hparams();
  const Backend& be = ex.be;
  const int64_t E = hp.n_embd;

  // attention
  {
    prof::Span span(prof::Part::attention, il);
    be.rms_norm_rows(x, l.attn_norm, n_tok, E, hp.eps, h);
    gqa_attention(be, hp, l, seqs, il, h, n_tok, y);
    be.add(x, y, n_tok * E);  // residual
  }

  // routed experts (+ shared expert)
  moe_block(ex, m, l, il, x, n_tok, nullptr, hp.expert_glu, h, y);
  if (l.gate_shexp) {
    prof::Span span(prof::Part::shared_ffn, il);
    std::vector<float> gate(size_t(n_tok), 1.0f);
    if (l.gate_inp_shexp) {
      for (int64_t t = 0; t < n_tok; ++t) {
        float z = 0;
        for (int64_t i = 0; i < E; ++i) z += f32(l.gate_inp_shexp)[i] * h[t * E + i];
        gate[size_t(t)] = 1.0f / (1.0f + std::exp(-z));
      }
    }
    be.swiglu_ffn(l.gate_shexp, l.up_shexp, l.down_shexp, h, n_tok, gate.data(), true, y);
  }
  be.add(x, y, n_tok * E);  // residual
}

void forward_gqa_moe(const Model& m, const Exec& ex, std::span<const SeqSpan> seqs, const int32_t* tokens,
                     bool all_logits, float* logits, float* hidden) {
  const HParams& hp = m.hparams();
  const int64_t n_tok = batch_tokens(seqs);
  const int64_t E = hp.n_embd;
  std::vector<float> x(size_t(n_tok * E)), h(size_t(n_tok * E)), y(size_t(n_tok * E));
  embed(m, tokens, n_tok, x.data());
  for (int il = 0; il < hp.n_layer; ++il)
    gqa_moe_block(m, ex, seqs, il, m.layers[size_t(il)], x.data(), n_tok, h.data(), y.data());
  if (hidden != nullptr) std::copy(x.begin(), x.end(), hidden);
  output_head(m, ex.be, x.data(), seqs, all_logits, logits);
}

void output_head(const Model& m, const Backend& be, const float* x, std::span<const SeqSpan> seqs,
                 bool all_logits, float* logits, const Weight* norm_w, const Weight* head_w) {
  prof::Span span(prof::Part::output);
  const Weight& norm = norm_w != nullptr ? *norm_w : m.output_norm;
  const Weight& head = head_w != nullptr ? *head_w : m.output;
  const int64_t E = m.hparams().n_embd;
  const int64_t n_tok = batch_tokens(seqs);
  if (all_logits) {
    std::vector<float> h(size_t(n_tok * E));
    be.rms_norm_rows(x, norm, n_tok, E, m.hparams().eps, h.data());
    be.matmul(head, h.data(), n_tok, logits);
    return;
  }
  // the last token of each span
  const int64_t n = int64_t(seqs.size());
  std::vector<float> h(size_t(n * E));
  int64_t end = 0;
  for (int64_t s = 0; s < n; ++s) {
    end += seqs[size_t(s)].n_tok;
    be.rms_norm_rows(x + (end - 1) * E, norm, 1, E, m.hparams().eps, h.data() + s * E);
  }
  be.matmul(head, h.data(), n, logits);
}

void init_cache(const Model& m, int n_ctx, KvCache& cache, KvType type) {
  const HParams& hp = m.hparams();
  if (hp.arch == Arch::deepseek4) {
    init_deepseek4_cache(m, n_ctx, cache);
  } else if (hp.arch == Arch::deepseek41) {
    init_deepseek41_cache(m, n_ctx, cache);
  } else if (hp.arch == Arch::deepseek2) {
    // MLA caches the normalised latent c and the roped shared k_pe: v is derived from c
    cache.init(hp.n_layer, n_ctx, hp.kv_lora_rank + hp.qk_rope, 0);
  } else {
    // qwen3moe, qwen2moe, llama, gpt-oss: every position of every layer, sliding-window layers
    // included (attention_gqa skips the rows outside the window)
    cache.init_key_blocks(hp.n_layer, n_ctx, hp.n_head_kv, hp.head_dim_k, hp.n_head_kv * hp.head_dim_v,
                          gqa_cache_type(hp, type));
  }
}

}  // namespace strata
