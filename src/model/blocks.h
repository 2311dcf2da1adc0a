// Blocks shared by the architectures' forward passes: routing, the routed-expert FFN, SwiGLU
// FFNs, GQA attention. Activations are row-major [n_tok][width] float buffers.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/kv_cache.h"
#include "model/model.h"

namespace strata {

// Chosen experts and their output weights, best first: ids[t * k + j], weights[t * k + j].
struct Routing {
  int k = 0;
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// Router of layer `l` applied to h [n_tok][n_embd] with the architecture's gating rule.
Routing route(const cpu::CpuBackend& be, const HParams& hp, const LayerWeights& l, const float* h,
              int64_t n_tok);

// out[t] = sum_j weights[t][j] * expert_{ids[t][j]}(h[t]) for SwiGLU experts stacked in
// gate/up/down. Tokens are grouped by expert so each expert's weights are read once per call.
void moe_ffn(const cpu::CpuBackend& be, const LayerWeights& l, const Routing& r, const float* h, int64_t n_tok, int64_t n_embd,
             float* out);

// out[t] (+)= down(silu(gate h[t]) * up h[t]) * (scale ? scale[t] : 1); accumulate adds to out.
void swiglu_ffn(const cpu::CpuBackend& be, const Weight& gate, const Weight& up, const Weight& down, const float* h,
                int64_t n_tok, const float* scale, bool accumulate, float* out);

struct AttentionParams {
  int n_head = 0, n_head_kv = 0, head_dim_k = 0, head_dim_v = 0;
  float scale = 0;
};
// Causal GQA attention of n_tok queries at positions pos0.. over the layer's cache rows 0..pos.
// q: [n_tok][n_head][head_dim_k]; out: [n_tok][n_head][head_dim_v].
void attention_gqa(const AttentionParams& p, KvCache& cache, int layer, const float* q,
                   int64_t n_tok, int64_t pos0, float* out);

// Adds bias b (F32 [n]) to every row of x [n_tok][n]; no-op for an empty weight.
void add_bias(float* x, const Weight& b, int64_t n_tok, int64_t n);

}  // namespace strata
