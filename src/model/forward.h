// The forward passes, one per architecture family (arch_*.cpp). Each evaluates a batch of tokens
// from one or more sequences: `tokens` is the concatenation of the spans in `seqs`, span s holding
// seqs[s].n_tok tokens of the sequence whose cache is seqs[s].cache, at positions
// pos0 .. pos0 + n_tok - 1 (their keys and values are appended there). Every weight is read once
// for the whole batch; attention runs per span over its own cache. Writes the logits of every token
// ([n_tok][n_vocab]) when all_logits, else of the last token of each span ([n_spans][n_vocab]).
#pragma once

#include <cstdint>
#include <span>

#include "engine/kv_cache.h"
#include "model/model.h"

namespace strata {

struct SeqSpan {
  KvCache* cache = nullptr;
  int64_t pos0 = 0;
  int64_t n_tok = 0;
};

// qwen3moe, qwen2moe, llama (Mixtral), gpt-oss: GQA attention (biases, sinks and sliding windows
// where the model has them) + routed experts (hp.expert_glu; + shared expert).
void forward_gqa_moe(const Model& m, const cpu::CpuBackend& be, std::span<const SeqSpan> seqs, const int32_t* tokens,
                     bool all_logits, float* logits);
// deepseek2: MLA attention, leading dense layers, shared experts, grouped sigmoid routing.
void forward_deepseek2(const Model& m, const cpu::CpuBackend& be, std::span<const SeqSpan> seqs, const int32_t* tokens,
                       bool all_logits, float* logits);

// deepseek4: hyper-connection streams, compressed attention with the lightning indexer, grouped
// output LoRA, hash-routed and sqrt-softplus routed experts (arch_deepseek4.cpp).
void forward_deepseek4(const Model& m, const cpu::CpuBackend& be, std::span<const SeqSpan> seqs, const int32_t* tokens,
                       bool all_logits, float* logits);
void init_deepseek4_cache(const Model& m, int n_ctx, KvCache& cache);

// The cache shape each family needs; `type` applies to GQA caches (MLA's latent rows are float).
void init_cache(const Model& m, int n_ctx, KvCache& cache, KvType type = KvType::f32);

// Final norm and lm head for the rows of x [n_tok][n_embd] that are asked for: all, or the last of
// each span.
void output_head(const Model& m, const cpu::CpuBackend& be, const float* x, std::span<const SeqSpan> seqs,
                 bool all_logits, float* logits);
// Total tokens of a batch.
int64_t batch_tokens(std::span<const SeqSpan> seqs);

}  // namespace strata
