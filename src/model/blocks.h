// Blocks shared by the architectures' forward passes: routing, the routed-expert FFN, SwiGLU
// FFNs, GQA attention. Activations are row-major [n_tok][width] float buffers.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/backend.h"
#include "model/experts.h"
#include "model/forward.h"
#include "model/kv_cache.h"
#include "model/model.h"

namespace strata {

// Chosen experts and their output weights, best first: ids[t * k + j], weights[t * k + j].
struct Routing {
  int k = 0;
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// Replaces the routers' choices (`strata bench --routing`): random-weight models route
// unrealistically, so the tiers are also measured on recorded or synthetic routing. The forward
// pass's override (Exec::routing, the engine's routing_override), when set, is asked after each
// router of a main layer.
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

// Weights that may still be arriving (a routed expert the NVMe tier is reading): the FFN runner
// computes the FFNs whose weights are in first, and waits for the others.
class PendingWeights {
 public:
  virtual ~PendingWeights() = default;
  // In now (or failed): a task on them would not block.
  virtual bool arrived() const = 0;
  // Blocks until they are in; false when they will not come (their tier reports why).
  virtual bool wait() const = 0;
};

// One SwiGLU FFN of a batch (a routed expert, a shared expert or a dense FFN) and the rows of h it
// runs on: out[tokens[i]] += scale[i] * (down(act(gate h + gate_b) * (up h + up_b)) + down_b).
struct FfnWork {
  Weight gate, up, down;          // 2D: [F][E], [F][E], [E][F]
  const float* gate_b = nullptr;  // [F] (null: none)
  const float* up_b = nullptr;    // [F]
  const float* down_b = nullptr;  // [E]
  std::vector<int64_t> tokens;    // rows of h, increasing
  std::vector<float> scale;       // per token (same length as tokens)
  const PendingWeights* pending = nullptr;  // null: the weights are in memory
};

// The active experts of routing r over n_tok tokens, in id order (ids), and for each its tokens in
// token order with their routing weights and its biases from l (work[i] for ids[i]); the
// matrices are left empty: where they are is the caller's choice.
struct ExpertBatch {
  std::vector<int32_t> ids;
  std::vector<FfnWork> work;
};
ExpertBatch group_by_expert(const LayerWeights& l, const Routing& r, int64_t n_tok, int64_t n_embd);

// Runs every FFN of `ffns` on h [n_h][E] and adds each token's outputs into out [n_h][E] in batch
// order (so the sum's order is fixed: a batch cut into groups that go in id order sums as one
// call); numa: the routed experts' row split (cpu::numa_snapshot), null for dense FFNs. Every
// FFN's matrices share one type per role (the stacks of a layer).
void run_ffns(const cpu::Matmul& mm, const std::vector<FfnWork>& ffns, const float* h, int64_t n_h,
              const GluParams& glu, float* out, const cpu::NumaLayout* numa = nullptr);

// out[t] = sum_j weights[t][j] * expert_{ids[t][j]}(h[t]) for SwiGLU experts stacked in l's
// gate/up/down (with l's expert biases, if any, and activation `glu`), computed from those stacks.
// Tokens are grouped by expert so each expert's weights are read once per call.
void moe_ffn(const cpu::Matmul& mm, const LayerWeights& l, const Routing& r, const float* h, int64_t n_tok,
             int64_t n_embd, float* out, const GluParams& glu = {});

// Routing look-ahead (issue #6): right after layer il's attention, x [n_tok][E] (the FFN input
// before its norm) normalised and routed by the routers of layers il+1 .. il+depth (depth: what
// ex.experts asks for); their chosen experts are handed to ex.experts.prefetch (a routing override
// is peeked instead). Nothing for batches above kPrefetchMaxTokens (a prefill needs nearly every
// expert of a layer anyway: its reads start when the layer is routed), nor for hash-routed layers
// (look_ahead_hashed).
inline constexpr int64_t kPrefetchMaxTokens = 8;
void look_ahead(const Exec& ex, const Model& m, int il, const float* x, int64_t n_tok);
// Hash-routed layers (deepseek4) choose their experts from the token ids alone: before the first
// layer, each one's experts go to ex.experts.prefetch, exactly.
void look_ahead_hashed(const Exec& ex, const Model& m, const int32_t* tokens, int64_t n_tok);

// The routed-expert part of layer il (weights l; il == hp.n_layer: the nextn layer, whose experts
// are the model's own and never overridden): the look-ahead from x [n_tok][E] (the FFN input
// before its norm), h = ffn_norm(x), the router (tokens: the ids, for hash-routed layers), a
// routing override, and the experts through ex.experts into y [n_tok][E] (overwritten). The
// shared experts and the residual are the caller's (they read h). host_norm: the norm on the
// host, not the backend (deepseek4 keeps its norms on the host).
void moe_block(const Exec& ex, const Model& m, const LayerWeights& l, int il, const float* x, int64_t n_tok,
               const int32_t* tokens, const GluParams& glu, float* h, float* y, bool host_norm = false);

// out[t] (+)= (down(act(gate h[t]) * up h[t]) + down_b) * (scale ? scale[t] : 1); accumulate adds
// to out.
void swiglu_ffn(const cpu::Matmul& mm, const Weight& gate, const Weight& up, const Weight& down, const float* h,
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

// out[t] = RMSNorm(x[t]) * w for n_tok rows of n floats (may alias). A prefill's rows on
// compute_pool() (for_row_chunks).
void rms_norm_rows(const float* x, const Weight& w, int64_t n_tok, int64_t n, float eps, float* out);

// fn(r0, r1) over rows [0, n_rows) of `width` floats each: on the calling thread when the rows
// hold fewer than kPooledRowFloats floats (decode), else in about four chunks per thread of
// compute_pool(). The per-row steps of a prefill (norms, RoPE, the residual add, the KV cache's
// stores) are memory-bound and short, but on the caller alone they left the other threads idle
// for about 5% of a 512-token prefill.
inline constexpr int64_t kPooledRowFloats = int64_t(1) << 15;
void for_row_chunks(int64_t n_rows, int64_t width, const std::function<void(int64_t, int64_t)>& fn);

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
