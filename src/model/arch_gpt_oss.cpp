// gpt-oss: pre-norm blocks of GQA attention with biases and per-head sinks (sliding-window on the
// even layers, full on the odd ones; NEOX RoPE with YaRN, whose magnitude scales q and k) and a
// routed-expert FFN (router with bias, top-k of the logits, softmax over the chosen; experts with
// biases and the clamped swiglu_oai). See ../shared/fixtures/README.md (gpt-oss).
#include <vector>

#include "base/profiler.h"
#include "model/blocks.h"
#include "model/forward.h"

namespace strata {

void forward_gpt_oss(const Model& m, const cpu::CpuBackend& be, std::span<const SeqSpan> seqs,
                     const int32_t* tokens, bool all_logits, float* logits) {
  const HParams& hp = m.hparams();
  const int64_t n_tok = batch_tokens(seqs);
  const int64_t E = hp.n_embd;
  std::vector<float> x(size_t(n_tok * E)), h(size_t(n_tok * E)), y(size_t(n_tok * E));
  embed(m, tokens, n_tok, x.data());

  for (int il = 0; il < hp.n_layer; ++il) {
    const LayerWeights& l = m.layers[size_t(il)];

    // attention: q, k, v with biases; RoPE; sinks; a sliding window on the even layers
    {
      prof::Span span(prof::Part::attention, il);
      rms_norm_rows(x.data(), l.attn_norm, n_tok, E, hp.eps, h.data());
      gqa_attention(be, hp, l, seqs, il, h.data(), n_tok, y.data());
      cpu::add(x.data(), y.data(), n_tok * E);  // residual
    }

    // routed experts (biased router, softmax over the chosen, biased swiglu_oai experts)
    Routing routing;
    {
      prof::Span span(prof::Part::router, il);
      rms_norm_rows(x.data(), l.ffn_norm, n_tok, E, hp.eps, h.data());
      routing = route(be, hp, l, h.data(), n_tok);
    }
    {
      prof::Span span(prof::Part::experts, il);
      moe_ffn(be, l, routing, h.data(), n_tok, E, y.data(), hp.expert_glu);
    }
    cpu::add(x.data(), y.data(), n_tok * E);  // residual
  }
  output_head(m, be, x.data(), seqs, all_logits, logits);
}

}  // namespace strata
