// CpuBackend (model/backend.h): the ops as the engine's CPU kernels compute them (blocks.h).
#include "model/backend.h"

#include "model/blocks.h"

namespace strata {

void CpuBackend::route(const HParams& hp, const LayerWeights& l, const float* h, int64_t n_tok, int32_t* ids,
                       float* weights) const {
  std::vector<float> logits(size_t(n_tok) * size_t(hp.n_expert));
  mm_.matmul(l.router, h, n_tok, logits.data());
  add_bias(logits.data(), l.router_b, n_tok, hp.n_expert);
  route_topk(hp, l, logits.data(), n_tok, nullptr, ids, weights);
}

void CpuBackend::rms_norm_rows(const float* x, const Weight& w, int64_t n_tok, int64_t n, float eps,
                               float* out) const {
  strata::rms_norm_rows(x, w, n_tok, n, eps, out);
}

void CpuBackend::rope(float* x, int64_t n_tok, int n_head, int head_dim, int64_t pos0,
                      const cpu::RopeParams& p) const {
  for (int64_t t = 0; t < n_tok; ++t) cpu::rope(x + t * n_head * head_dim, n_head, head_dim, pos0 + t, p);
}

void CpuBackend::attention_gqa(const AttentionParams& p, KvCache& cache, int layer, const float* q, int64_t n_tok,
                               int64_t pos0, float* out) const {
  strata::attention_gqa(p, cache, layer, q, n_tok, pos0, out);
}

void CpuBackend::attention_mla(int n_head, int kv_lora, int rope, float scale, KvCache& cache, int layer,
                               const float* q, int64_t n_tok, int64_t pos0, float* out) const {
  strata::attention_mla(n_head, kv_lora, rope, scale, cache, layer, q, n_tok, pos0, out);
}

void CpuBackend::swiglu_ffn(const Weight& gate, const Weight& up, const Weight& down, const float* h, int64_t n_tok,
                            const float* scale, bool accumulate, float* out, const SwigluOptions& opt) const {
  strata::swiglu_ffn(mm_, gate, up, down, h, n_tok, scale, accumulate, out, opt);
}

}  // namespace strata
