// Routing traces: which routed experts each token chose at each MoE layer, in time order. The
// input of the expert-cache replay (storage/expert_cache.h) and of prefetch studies.
//
// Two sources: a recorded trace in JSONL (read_routing_trace; the format of
// ../shared/traces/README.md) and a synthetic skewed trace (synthetic_routing_trace).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/error.h"

namespace strata {

// One token at one layer: the experts its router chose.
struct RoutingStep {
  int32_t layer = 0;      // MoE layer index, 0-based
  int32_t token_pos = 0;  // as recorded (the Mixtral trace logs every prompt token at 0)
  uint32_t first = 0;     // its experts are RoutingTrace::experts[first, first + count)
  uint32_t count = 0;     // experts chosen (top-k), distinct
};

struct RoutingTrace {
  std::string source;     // file name, or a description of the synthetic parameters
  int32_t n_layer = 0;    // layers 0 .. n_layer-1 (a file: the largest layer seen + 1)
  int32_t n_expert = 0;   // routed experts per layer (a file: the largest id seen + 1)
  int32_t top_k = 0;      // the most experts of any step
  std::vector<RoutingStep> steps;  // [n_steps], time order
  std::vector<int32_t> experts;    // [sum of steps' counts] expert ids, each in [0, n_expert)

  std::span<const int32_t> experts_of(const RoutingStep& s) const {
    return {experts.data() + s.first, s.count};
  }
  // Expert accesses in the whole trace (sum of top-k over steps).
  int64_t n_accesses() const { return int64_t(experts.size()); }
  // Tokens the trace covers: each token routes once per MoE layer, so steps / n_layer (fractional
  // when a recording missed some records, as the Mixtral trace does).
  double n_tokens() const { return n_layer ? double(steps.size()) / n_layer : 0.0; }
};

// Upper bounds on a trace's shape, so that a corrupt line cannot make the replay size its
// per-expert tables (about 40 bytes per layer x expert) beyond a few hundred MB. Real models are
// far below (DeepSeek-V3: 61 layers, 256 experts; Kimi K2: 384 experts).
inline constexpr int32_t kMaxTraceLayers = 1024;
inline constexpr int32_t kMaxTraceExperts = 4096;

// Reads a JSONL routing trace: one object per line with integer "layer" and "token_pos" (>= 0) and
// "experts" (a non-empty array of distinct integers >= 0); other fields are ignored, blank lines
// skipped. File order is time order. Any bad line is an error "FILE:LINE: what is wrong".
Result<RoutingTrace> read_routing_trace(const std::string& path);

// Same, from text already in memory; `name` stands for the file in messages.
Result<RoutingTrace> parse_routing_trace(const std::string& text, const std::string& name);

// The same records in token-major order, as a decode loop visits them: token 0 at layers
// 0..n_layer-1, then token 1, ... where token t of a layer is that layer's t-th record in the
// input. Each layer's own sequence is unchanged, so per-layer policies see the same accesses;
// policies that share slots across layers see a realistic interleaving. (The Mixtral trace's file
// is layer-major for its decode tokens: all of layer 0, then all of layer 1, ...)
RoutingTrace token_major_order(const RoutingTrace& trace);

// A synthetic skewed trace, token-major. Each layer ranks its experts by a random permutation (so
// hot experts differ between layers); a fresh pick chooses the expert of rank r with probability
// proportional to 1 / r^zipf_s (0: uniform). Temporal locality: each of a token's top_k picks at
// a layer repeats one of the previous token's experts at that layer with probability `repeat`.
// Drift: popularity is not fixed (real routing shifts with the text); before each token, each layer
// swaps the ranks of random pairs of experts, drift * n_expert / 2 swaps on average (so about a
// fraction `drift` of its experts change rank per token, whatever n_expert is).
//
// The defaults are fitted to the Mixtral trace: with its shape (32x8, top-2, 212 tokens), LRU,
// per-layer LRU, LFU (half-lives 8 and infinity) and Belady at 1/8 .. 7/8 of the experts per layer
// land within 3 points of the real trace's token-major figures (RMS 1.3 points over 35 figures).
struct SyntheticTraceParams {
  int32_t n_layer = 48;      // qwen3-30b-a3b: 48 MoE layers
  int32_t n_expert = 128;    //   128 routed experts per layer
  int32_t top_k = 8;         //   8 active per token
  int64_t n_tokens = 1000;
  double zipf_s = 0.8;
  double repeat = 0.15;      // in [0, 1]
  double drift = 0.05;       // in [0, 1]
  uint64_t seed = 1;
};
// Errors on a shape out of range (top_k > n_expert, non-positive sizes, repeat or drift outside
// [0, 1]).
Result<RoutingTrace> synthetic_routing_trace(const SyntheticTraceParams& p);

}  // namespace strata
