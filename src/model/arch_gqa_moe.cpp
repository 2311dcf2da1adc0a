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

void forward_gqa_moe(const Model& m, const cpu::CpuBackend& be, std::span<const SeqSpan> seqs, const int32_t* tokens,
                     bool all_logits, float* logits) {
  const HParams& hp = m.hparams();
  const int64_t n_tok = batch_tokens(seqs);
  const int64_t E = hp.n_embd;
  std::vector<float> x(size_t(n_tok * E)), h(size_t(n_tok * E)), y(size_t(n_tok * E));
  embed(m, tokens, n_tok, x.data());

  for (int il = 0; il < hp.n_layer; ++il) {
    const LayerWeights& l = m.layers[size_t(il)];

    // attention
    {
      prof::Span span(prof::Part::attention, il);
      rms_norm_rows(x.data(), l.attn_norm, n_tok, E, hp.eps, h.data());
      gqa_attention(be, hp, l, seqs, il, h.data(), n_tok, y.data());
      cpu::add(x.data(), y.data(), n_tok * E);  // residual
    }

    // routed experts (+ shared expert)
    Routing routing;
    {
      prof::Span span(prof::Part::router, il);
      prefetch_experts(be, m, il, x.data(), n_tok);
      rms_norm_rows(x.data(), l.ffn_norm, n_tok, E, hp.eps, h.data());
      routing = route(be, hp, l, h.data(), n_tok);
      if (m.routing_override != nullptr) m.routing_override->choose(il, n_tok, routing);
    }
    {
      prof::Span span(prof::Part::experts, il);
      moe_ffn(be, l, routing, h.data(), n_tok, E, y.data(), hp.expert_glu, m.expert_store.get(), il);
    }
    if (l.gate_shexp) {
      prof::Span span(prof::Part::shared_ffn, il);
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
  output_head(m, be, x.data(), seqs, all_logits, logits);
}

void output_head(const Model& m, const cpu::CpuBackend& be, const float* x, std::span<const SeqSpan> seqs,
                 bool all_logits, float* logits) {
  prof::Span span(prof::Part::output);
  const int64_t E = m.hparams().n_embd;
  const int64_t n_tok = batch_tokens(seqs);
  if (all_logits) {
    std::vector<float> h(size_t(n_tok * E));
    rms_norm_rows(x, m.output_norm, n_tok, E, m.hparams().eps, h.data());
    be.matmul(m.output, h.data(), n_tok, logits);
    return;
  }
  // the last token of each span
  const int64_t n = int64_t(seqs.size());
  std::vector<float> h(size_t(n * E));
  int64_t end = 0;
  for (int64_t s = 0; s < n; ++s) {
    end += seqs[size_t(s)].n_tok;
    rms_norm_rows(x + (end - 1) * E, m.output_norm, 1, E, m.hparams().eps, h.data() + s * E);
  }
  be.matmul(m.output, h.data(), n, logits);
}

void init_cache(const Model& m, int n_ctx, KvCache& cache, KvType type) {
  const HParams& hp = m.hparams();
  if (hp.arch == Arch::deepseek4) {
    init_deepseek4_cache(m, n_ctx, cache);
  } else if (hp.arch == Arch::deepseek2) {
    // MLA caches the normalised latent c and the roped shared k_pe: v is derived from c
    cache.init(hp.n_layer, n_ctx, hp.kv_lora_rank + hp.qk_rope, 0);
  } else {
    // qwen3moe, qwen2moe, llama, gpt-oss: every position of every layer, sliding-window layers
    // included (attention_gqa skips the rows outside the window)
    cache.init_key_blocks(hp.n_layer, n_ctx, hp.n_head_kv, hp.head_dim_k, hp.n_head_kv * hp.head_dim_v, type);
  }
}

}  // namespace strata
