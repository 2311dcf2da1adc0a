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
  for_row_chunks(n_tok, int64_t(n_head) * head_dim, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) cpu::rope(x + t * n_head * head_dim, n_head, head_dim, pos0 + t, p);
  });
}

void CpuBackend::add(float* y, const float* x, int64_t n) const {
  constexpr int64_t kRow = 4096;  // floats a row of the chunking (n need not be a multiple)
  for_row_chunks((n + kRow - 1) / kRow, kRow, [&](int64_t r0, int64_t r1) {
    const int64_t i0 = r0 * kRow, i1 = std::min(n, r1 * kRow);
    cpu::add(y + i0, x + i0, i1 - i0);
  });
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
