// The forward passes, one per architecture family (arch_*.cpp). Each evaluates n_tok tokens at
// positions pos0 .. pos0 + n_tok - 1, appending their keys and values to `cache`, and writes the
// logits of every token ([n_tok][n_vocab]) when all_logits, else of the last one ([n_vocab]).
#pragma once

#include <cstdint>

#include "engine/kv_cache.h"
#include "model/model.h"

namespace strata {

// qwen3moe, qwen2moe, llama (Mixtral): GQA attention + routed experts (+ shared expert).
void forward_gqa_moe(const Model& m, const cpu::CpuBackend& be, KvCache& cache, const int32_t* tokens, int64_t n_tok,
                     int64_t pos0, bool all_logits, float* logits);
// gpt-oss: GQA attention with biases, sinks and alternating sliding windows; biased experts with
// swiglu_oai, softmax over the top-k router logits.
void forward_gpt_oss(const Model& m, const cpu::CpuBackend& be, KvCache& cache, const int32_t* tokens, int64_t n_tok,
                     int64_t pos0, bool all_logits, float* logits);
// deepseek2: MLA attention, leading dense layers, shared experts, grouped sigmoid routing.
void forward_deepseek2(const Model& m, const cpu::CpuBackend& be, KvCache& cache, const int32_t* tokens, int64_t n_tok,
                       int64_t pos0, bool all_logits, float* logits);

// The cache shape each family needs (floats per position of k and v).
void init_cache(const Model& m, int n_ctx, KvCache& cache);

// Final norm and lm head for the rows of x [n_tok][n_embd] that are asked for.
void output_head(const Model& m, const cpu::CpuBackend& be, const float* x, int64_t n_tok, bool all_logits, float* logits);

}  // namespace strata
