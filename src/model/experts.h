// The routed experts as the forward passes see them: one interface, whatever tier holds them.
// The forward pass routes (model/blocks.h route), predicts the next layers' routing for the
// tiers' look-ahead, and hands each MoE layer's routing to RoutedExperts::run; where the experts'
// weights are (the model's own stacks, a VRAM slot, a RAM slot being read from the file) is the
// implementation's business. The engine implements it over its tiers (engine/tiered_experts.h);
// ResidentExperts computes every expert from the model's weights.
#pragma once

#include <cstdint>
#include <span>

#include "cpu/ops.h"
#include "model/backend.h"
#include "model/model.h"

namespace strata {

struct Routing;
class RoutingOverride;

class RoutedExperts {
 public:
  virtual ~RoutedExperts() = default;
  // Layers of routing look-ahead the implementation wants after each layer's attention (0: none;
  // the forward pass then computes no prediction).
  virtual int lookahead_depth() const { return 0; }
  // Layer `layer` is predicted to choose `experts` (distinct, best first), `distance` layers ahead
  // of the layer being computed (for hash-routed layers: known exactly from the token ids).
  virtual void prefetch(int /*layer*/, int /*distance*/, std::span<const int32_t> /*experts*/) {}
  // out [n_tok][n_embd] = sum_j r.weights[t][j] * expert_{r.ids[t][j]}(h[t]) for main layer il
  // (weights l: types, shapes and biases; the expert stacks of l may be absent from RAM), with
  // activation glu; the CPU's share through mm. The result is that of moe_ffn on l's stacks.
  virtual void run(const cpu::Matmul& mm, const LayerWeights& l, int il, const Routing& r, const float* h,
                   int64_t n_tok, int64_t n_embd, const GluParams& glu, float* out) = 0;
};

// Every expert from the model's own weight stacks (moe_ffn). Stateless: one instance may serve
// any number of threads and models.
class ResidentExperts final : public RoutedExperts {
 public:
  void run(const cpu::Matmul& mm, const LayerWeights& l, int il, const Routing& r, const float* h, int64_t n_tok,
           int64_t n_embd, const GluParams& glu, float* out) override;
};
RoutedExperts& resident_experts();

// What one forward pass runs on: the dense ops' backend, the routed experts, and (benchmarks) a
// routing override that replaces the routers' choices of the main layers. Not owned.
struct Exec {
  const Backend& be;
  RoutedExperts& experts;
  RoutingOverride* routing = nullptr;
  // The backend alone: every expert from the model's weights, the routers' own choices.
  explicit Exec(const Backend& b) : be(b), experts(resident_experts()) {}
  Exec(const Backend& b, RoutedExperts& e, RoutingOverride* o = nullptr) : be(b), experts(e), routing(o) {}
};

}  // namespace strata
