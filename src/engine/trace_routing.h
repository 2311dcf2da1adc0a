// Routing replayed from a trace instead of the routers' choices (`strata bench --routing`): a
// recorded trace (../shared/traces format) mapped onto the model's shape, or a synthetic skewed
// trace generated in it (storage/routing_trace.h). Random-weight models route unrealistically, so
// the NVMe tier is measured on these too.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "model/blocks.h"
#include "storage/routing_trace.h"

namespace strata {

class TraceRouting final : public RoutingOverride {
 public:
  // The trace's tokens (token-major: token t of a layer is that layer's t-th record) on the model's
  // layers: model layer l replays trace layer l % trace.n_layer. Experts: the same ids when the
  // shapes agree; else, when the model's expert count and top-k are multiples of the trace's
  // (Mixtral's 8 top-2 onto Qwen3's 128 top-8), each trace expert e stands for a group of
  // n_expert / trace.n_expert model experts, of which it picks top_k / trace.top_k consecutive
  // ones from a position hashed from (token, layer, e): the groups keep the trace's skew and its
  // token-to-token overlap, the experts within a group are used evenly (a trace of 8 experts says
  // nothing finer). Errors: shapes that do not map so, steps with fewer experts than top-k.
  static Result<std::unique_ptr<TraceRouting>> make(const RoutingTrace& trace, const HParams& hp);

  void choose(int il, int64_t n_tok, Routing& r) override;
  std::vector<int32_t> peek(int il, int64_t n_tok) const override;
  int64_t n_tokens() const { return n_tokens_; }

 private:
  const int32_t* token(int il, int64_t t) const {
    return &ids_[size_t(((t % n_tokens_) * n_layer_ + il) * k_)];
  }
  std::vector<int32_t> ids_;  // [n_tokens][n_layer][k]
  int64_t n_tokens_ = 0;
  int n_layer_ = 0, k_ = 0;
  std::vector<int64_t> pos_;  // [n_layer] tokens already chosen at each layer
};

// "model" -> null (the routers decide); "trace:FILE" -> FILE mapped onto the model;
// "synthetic" or "synthetic:ZIPF,REPEAT,DRIFT" -> synthetic_routing_trace in the model's shape
// (defaults: the values fitted to the Mixtral trace), 4096 tokens, seed 1. Errors name the mode.
Result<std::unique_ptr<TraceRouting>> make_routing_override(const std::string& mode, const HParams& hp);

}  // namespace strata
