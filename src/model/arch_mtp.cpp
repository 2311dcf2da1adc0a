// The multi-token-prediction (nextn) layer of DeepSeek-V3 style models (model.h, MtpWeights): one
// more block of the main layers' kind whose input mixes the main model's last hidden row with the
// next token's embedding. vLLM and SGLang run DeepSeek-V3's released weights with the embedding
// first in the concatenation, [enorm(embed(t)) ; hnorm(h)]; so does strata.
#include <vector>

#include "base/profiler.h"
#include "model/blocks.h"
#include "model/forward.h"

namespace strata {

void mtp_input(const Model& m, const Backend& be, const int32_t* tokens, const float* h_prev,
               int64_t n_tok, float* x) {
  STRATA_CHECK(m.mtp != nullptr, "mtp_input: the model has no MTP layer");
  const MtpWeights& w = *m.mtp;
  const HParams& hp = m.hparams();
  const int64_t E = hp.n_embd;
  std::vector<float> e(size_t(n_tok * E)), cat(size_t(n_tok * 2 * E));
  {
    prof::Span span(prof::Part::embed);
    const Weight& table = w.embed ? w.embed : m.tok_embd;
    for (int64_t t = 0; t < n_tok; ++t) cpu::get_row(table, tokens[t], e.data() + t * E);
  }
  for (int64_t t = 0; t < n_tok; ++t) {
    cpu::rms_norm(e.data() + t * E, f32(w.enorm), E, hp.eps, cat.data() + t * 2 * E);
    cpu::rms_norm(h_prev + t * E, f32(w.hnorm), E, hp.eps, cat.data() + t * 2 * E + E);
  }
  be.matmul(w.eh_proj, cat.data(), n_tok, x);
}

void forward_mtp(const Model& m, const Backend& be, std::span<const SeqSpan> seqs, const int32_t* tokens,
                 const float* h_prev, bool all_logits, float* logits, float* hidden) {
  STRATA_CHECK(m.mtp != nullptr, "forward_mtp: the model has no MTP layer");
  const MtpWeights& w = *m.mtp;
  const int64_t n_tok = batch_tokens(seqs), E = m.hparams().n_embd;
  std::vector<float> x(size_t(n_tok * E)), h(size_t(n_tok * E)), y(size_t(n_tok * E));
  mtp_input(m, be, tokens, h_prev, n_tok, x.data());
  const Exec ex(be);  // the nextn layer's experts are its own (moe_block)
  switch (m.hparams().arch) {
    case Arch::deepseek2: {
      MlaScratch scratch;
      deepseek2_block(m, ex, seqs, w.il, w.block, x.data(), n_tok, h.data(), y.data(), scratch);
      break;
    }
    case Arch::deepseek4:
    case Arch::deepseek41:
      STRATA_CHECK(false, "forward_mtp: not built for deepseek4 or deepseek41");
      break;
    default:
      gqa_moe_block(m, ex, seqs, w.il, w.block, x.data(), n_tok, h.data(), y.data());
      break;
  }
  std::copy(x.begin(), x.end(), hidden);
  output_head(m, be, x.data(), seqs, all_logits, logits, &w.head_norm, w.head ? &w.head : nullptr);
}

void init_mtp_cache(const Model& m, int n_ctx, KvCache& cache, KvType type) {
  STRATA_CHECK(m.mtp != nullptr, "init_mtp_cache: the model has no MTP layer");
  const HParams& hp = m.hparams();
  const int n = m.mtp->il + 1;
  if (hp.arch == Arch::deepseek2)
    cache.init(n, n_ctx, hp.kv_lora_rank + hp.qk_rope, 0, m.mtp->il);
  else
    cache.init_key_blocks(n, n_ctx, hp.n_head_kv, hp.head_dim_k, hp.n_head_kv * hp.head_dim_v, gqa_cache_type(hp, type),
                          m.mtp->il);
}

}  // namespace strata
