// The forward passes, one per architecture family (arch_*.cpp). Each evaluates a batch of tokens
// from one or more sequences: `tokens` is the concatenation of the spans in `seqs`, span s holding
// seqs[s].n_tok tokens of the sequence whose cache is seqs[s].cache, at positions
// pos0 .. pos0 + n_tok - 1 (their keys and values are appended there). Every weight is read once
// for the whole batch; attention runs per span over its own cache. Writes the logits of every token
// ([n_tok][n_vocab]) when all_logits, else of the last token of each span ([n_spans][n_vocab]).
// `hidden`, when not null, receives the last layer's output rows [n_tok][n_embd] (before the final
// norm: what a multi-token-prediction layer reads); deepseek4 and deepseek41 have no such rows to give.
// `ex` is what the pass runs on (model/experts.h): the backend's dense ops, the routed experts
// wherever their tiers keep them, and an optional routing override.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/experts.h"
#include "model/kv_cache.h"
#include "model/model.h"

namespace strata {

struct SeqSpan {
  KvCache* cache = nullptr;
  int64_t pos0 = 0;
  int64_t n_tok = 0;
};

// qwen3moe, qwen2moe, llama (Mixtral), gpt-oss: GQA attention (biases, sinks and sliding windows
// where the model has them) + routed experts (hp.expert_glu; + shared expert).
void forward_gqa_moe(const Model& m, const Exec& ex, std::span<const SeqSpan> seqs, const int32_t* tokens,
                     bool all_logits, float* logits, float* hidden = nullptr);
// deepseek2: MLA attention, leading dense layers, shared experts, grouped sigmoid routing.
void forward_deepseek2(const Model& m, const Exec& ex, std::span<const SeqSpan> seqs, const int32_t* tokens,
                       bool all_logits, float* logits, float* hidden = nullptr);

// One block (layer il, weights l) of those families on the residual stream x [n_tok][n_embd], in
// place; h and y are scratch of x's size. il == hp.n_layer is the nextn layer: its cache layer is
// il, and its experts are its own weights' (never a tier's, never replaced by a routing override).
void gqa_moe_block(const Model& m, const Exec& ex, std::span<const SeqSpan> seqs, int il,
                   const LayerWeights& l, float* x, int64_t n_tok, float* h, float* y);
struct MlaScratch {
  std::vector<float> q, kv, attn, qa;
};
void deepseek2_block(const Model& m, const Exec& ex, std::span<const SeqSpan> seqs, int il,
                     const LayerWeights& l, float* x, int64_t n_tok, float* h, float* y, MlaScratch& scratch);

// The multi-token-prediction layer (m.mtp, model.h) on n_tok tokens: row t's input is the
// embedding of tokens[t] and the hidden row h_prev[t] of the position before it; its keys go to
// layer m.mtp->il of each span's cache (init_mtp_cache). Writes the logits as the forward passes
// do, and the layer's output rows to `hidden` [n_tok][n_embd] (what a chained draft reads next).
void forward_mtp(const Model& m, const Backend& be, std::span<const SeqSpan> seqs, const int32_t* tokens,
                 const float* h_prev, bool all_logits, float* logits, float* hidden);
// The MTP layer's input rows, eh_proj [enorm(embed(tokens[t])) ; hnorm(h_prev[t])]: x [n_tok][n_embd].
void mtp_input(const Model& m, const Backend& be, const int32_t* tokens, const float* h_prev,
               int64_t n_tok, float* x);
// A cache for the MTP layer alone (the main layers' entries are left empty).
void init_mtp_cache(const Model& m, int n_ctx, KvCache& cache, KvType type = KvType::f32);

// deepseek4: hyper-connection streams, compressed attention with the lightning indexer, grouped
// output LoRA, hash-routed and sqrt-softplus routed experts (arch_deepseek4.cpp).
void forward_deepseek4(const Model& m, const Exec& ex, std::span<const SeqSpan> seqs, const int32_t* tokens,
                       bool all_logits, float* logits);
void init_deepseek4_cache(const Model& m, int n_ctx, KvCache& cache);
// deepseek41: Engram, lagged hyper-connections, compressed attention shared across layers
// (arch_deepseek41.cpp); the Engram rows through ex.engram.
void forward_deepseek41(const Model& m, const Exec& ex, std::span<const SeqSpan> seqs, const int32_t* tokens,
                        bool all_logits, float* logits);
void init_deepseek41_cache(const Model& m, int n_ctx, KvCache& cache);

// The forward pass of m's architecture family (one of the above, the same arguments); hidden must
// be null for deepseek4 and deepseek41.
void forward(const Model& m, const Exec& ex, std::span<const SeqSpan> seqs, const int32_t* tokens, bool all_logits,
             float* logits, float* hidden = nullptr);

// The cache shape each family needs; `type` applies to GQA caches (MLA's latent rows are float).
void init_cache(const Model& m, int n_ctx, KvCache& cache, KvType type = KvType::f32);

// Final norm and lm head for the rows of x [n_tok][n_embd] that are asked for: all, or the last of
// each span. norm / head replace the model's (the MTP layer's own).
void output_head(const Model& m, const Backend& be, const float* x, std::span<const SeqSpan> seqs,
                 bool all_logits, float* logits, const Weight* norm = nullptr, const Weight* head = nullptr);
// Total tokens of a batch.
int64_t batch_tokens(std::span<const SeqSpan> seqs);

}  // namespace strata
