// Hyper-connections (deepseek4, deepseek41; fixtures README): the residual is S streams of
// n_embd floats per token; around each sublayer a mixer computed from the RMS-normalised streams
// gives the weights of the streams into the sublayer (pre), of its output into each stream (post)
// and a stream-to-stream matrix made doubly stochastic by Sinkhorn. Also the two small helpers
// both architectures use: RoPE on the tail channels of each head, RMSNorm without a weight.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu/ops.h"
#include "model/backend.h"
#include "model/model.h"

namespace strata {

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// RMSNorm of each row of n floats, without a weight.
void rms_norm_plain(float* x, int64_t n_rows, int64_t n, float eps);

// One token's hyper-connection mixer: the weights of the streams into the sublayer (pre), of the
// sublayer's output into each stream (post) and the stream-to-stream matrix C[d][s].
struct HcMix {
  std::vector<float> pre, post, c;  // [n_tok][S], [n_tok][S], [n_tok][S][S]
};

// The mixers of n_tok tokens from their streams X [n_tok][S][E] (weights fn, base, scale).
HcMix hc_mix(const Backend& be, const HParams& hp, const Weight& fn, const Weight& base_w, const Weight& scale_w,
             const float* X, int64_t n_tok);
// The sublayer's input: x[t] = sum_s pre[t][s] X[t][s].
void hc_pre(const HcMix& mix, const float* X, int64_t n_tok, int64_t S, int64_t E, float* x);
// The streams after the sublayer: X'[d] = post[d] y + sum_s C[d][s] X[s].
void hc_post(const HcMix& mix, const float* y, int64_t n_tok, int64_t S, int64_t E, float* X);

// Rotates the last n_rot channels of each of n_head heads of width `dim` at position pos (a
// negative position rotates back).
void rope_tail(float* x, int64_t n_head, int64_t dim, int64_t pos, const cpu::RopeParams& p);

}  // namespace strata
