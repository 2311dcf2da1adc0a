// Blocks shared by the architectures' forward passes: routing, the routed-expert FFN, SwiGLU
// FFNs, GQA attention. Activations are row-major [n_tok][width] float buffers.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/kv_cache.h"
#include "model/backend.h"
#include "model/forward.h"
#include "model/model.h"

namespace strata {

// Chosen experts and their output weights, best first: ids[t * k + j], weights[t * k + j].
struct Routing {
  int k = 0;
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// Replaces the routers' choices (`strata bench --routing`): random-weight models route
// unrealistically, so the tiers are also measured on recorded or synthetic routing. The model's
// `routing_override`, when set, is asked after each router.
class RoutingOverride {
 public:
  virtual ~RoutingOverride() = default;
  // The experts (k per token, distinct) of the next n_tok tokens at layer il, written into r.ids;
  // the weights stay the router's. Advances layer il's position by n_tok.
  virtual void choose(int il, int64_t n_tok, Routing& r) = 0;
  // What choose(il, n_tok) will give, without advancing (the NVMe look-ahead reads it: an oracle).
  virtual std::vector<int32_t> peek(int il, int64_t n_tok) const = 0;
};

// The distinct experts of ids [n_tok][k], best rank first (every token's first choice, then every
// token's second, ...): the order in which the NVMe look-ahead reads them.
std::vector<int32_t> experts_by_rank(std::span<const int32_t> ids, int64_t n_tok, int k);

// Router of layer `l` (plus its bias, if any) applied to h [n_tok][n_embd] with the architecture's
// gating rule (hp.gating). A hash-routed layer (l.tid2eid, deepseek4) takes its experts from the
// table row of each token's id in `tokens` instead, weighted by the router's scores.
// Backend::route computes the rest (the router on the backend's device, then route_topk's rule).
Routing route(const Backend& be, const HParams& hp, const LayerWeights& l, const float* h,
              int64_t n_tok, const int32_t* tokens = nullptr);
// The rule on router logits [n_tok][n_expert] (with the router's bias; overwritten): the gating's
// scores (hp.gating) chosen by score + l.exp_probs_b, within the n_group_used best groups (by
// their top-2 sum) when the experts are grouped, the k best (ties to the lower id; the table row
// of tokens[t] for a hash-routed layer), weighted by their scores (a softmax over the chosen for
// softmax_topk; normalised with hp.norm_topk; times hp.expert_weights_scale): ids / weights
// [n_tok][k].
void route_topk(const HParams& hp, const LayerWeights& l, float* logits, int64_t n_tok, const int32_t* tokens,
                int32_t* ids, float* weights);

// out[t] = sum_j weights[t][j] * expert_{ids[t][j]}(h[t]) for SwiGLU experts stacked in
// gate/up/down (with the expert biases of `l`, if any, and activation `glu`). Tokens are grouped by
// expert so each expert's weights are read once per call. With `store` (the NVMe tier), the
// experts' weights come from it (layer `layer`), not from l's stacks; the result is the same.
// With `gpu` (the GPU tier), experts the VRAM cache holds ready are computed from their slot.
void moe_ffn(const cpu::Matmul& be, const LayerWeights& l, const Routing& r, const float* h, int64_t n_tok, int64_t n_embd,
             float* out, const GluParams& glu = {}, ExpertStore* store = nullptr, int layer = -1,
             GpuTier* gpu = nullptr);

// Routing look-ahead of the NVMe tier (issue #6): right after layer il's attention, x [n_tok][E]
// (the residual stream) normalised and routed by the routers of layers il+1 .. il+depth; their
// chosen experts are handed to m.expert_store's prefetch. Nothing without a store, or for batches
// above kPrefetchMaxTokens (a prefill needs nearly every expert of a layer anyway: its reads start
// when the layer is routed).
inline constexpr int64_t kPrefetchMaxTokens = 8;
void prefetch_experts(const Backend& be, const Model& m, int il, const float* x, int64_t n_tok);

// out[t] (+)= (down(act(gate h[t]) * up h[t]) + down_b) * (scale ? scale[t] : 1); accumulate adds
// to out.
void swiglu_ffn(const cpu::Matmul& be, const Weight& gate, const Weight& up, const Weight& down, const float* h,
                int64_t n_tok, const float* scale, bool accumulate, float* out, const SwigluOptions& opt = {});

// Causal GQA attention of n_tok queries at positions pos0.. over the layer's cache rows 0..pos
// (the last n_swa of them with a window). A sink adds exp(sink[h]) to head h's softmax denominator:
// a virtual key, in the units of the scaled scores, that has no value.
// q: [n_tok][n_head][head_dim_k]; out: [n_tok][n_head][head_dim_v].
void attention_gqa(const AttentionParams& p, KvCache& cache, int layer, const float* q,
                   int64_t n_tok, int64_t pos0, float* out);

// MLA's attention core on the CPU (Backend::attention_mla's contract), a task per (token, head).
void attention_mla(int n_head, int kv_lora, int rope, float scale, KvCache& cache, int layer, const float* q,
                   int64_t n_tok, int64_t pos0, float* out);

// x[t] = row tokens[t] of the token embeddings; x: [n_tok][n_embd].
void embed(const Model& m, const int32_t* tokens, int64_t n_tok, float* x);

// out[t] = RMSNorm(x[t]) * w for n_tok rows of n floats (may alias).
void rms_norm_rows(const float* x, const Weight& w, int64_t n_tok, int64_t n, float eps, float* out);

// The GQA attention sublayer of layer il on the normalised input h [n_tok][n_embd]: q, k, v (+ the
// layer's biases), per-head q/k RMSNorm when the layer has it (qwen3moe), RoPE, the new keys and
// values appended to each span's cache, attention of each span over its own cache (with the
// layer's sliding window and sinks, if any) and the output projection (+ bias) into
// y [n_tok][n_embd]; the projections run once for the whole batch. The residual add is the
// caller's.
void gqa_attention(const Backend& be, const HParams& hp, const LayerWeights& l,
                   std::span<const SeqSpan> seqs, int il, const float* h, int64_t n_tok, float* y);

// Adds bias b (F32 [n]) to every row of x [n_tok][n]; no-op for an empty weight.
void add_bias(float* x, const Weight& b, int64_t n_tok, int64_t n);

}  // namespace strata
