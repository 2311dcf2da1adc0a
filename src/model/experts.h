// The routed experts (and deepseek41's Engram rows) as the forward passes see them: one interface, whatever tier holds them.
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

// deepseek41's Engram tables (model/engram.h) as the forward pass sees them: rows by id, wherever a
// tier keeps them (the model's mapping, a row cache in RAM filled from the file). Before a batch's
// first layer runs, the forward pass hands every Engram layer's rows of the batch to prefetch
// (they depend on the token ids alone); it gathers a layer's rows when it reaches the layer.
class EngramRows {
 public:
  virtual ~EngramRows() = default;
  // Layer il will read `rows` (any order, repeats allowed) in this forward pass.
  virtual void prefetch(int /*il*/, std::span<const int64_t> /*rows*/) {}
  // The rows of layer il's table (l.engram_embd: type, row width) dequantized into
  // out [rows.size()][key_length]. False when they cannot be had (a failed read; the tier keeps
  // the error for the caller of the forward pass): out is then left as it is, never zero-filled.
  virtual bool gather(const LayerWeights& l, int il, std::span<const int64_t> rows, float* out) = 0;
};

// Every row from the model's own table. Stateless.
class ResidentEngram final : public EngramRows {
 public:
  bool gather(const LayerWeights& l, int il, std::span<const int64_t> rows, float* out) override;
};
EngramRows& resident_engram();

// What one forward pass runs on: the dense ops' backend, the routed experts, and (benchmarks) a
// routing override that replaces the routers' choices of the main layers. Not owned.
struct Exec {
  const Backend& be;
  RoutedExperts& experts;
  RoutingOverride* routing = nullptr;
  EngramRows& engram;
  // The backend alone: every expert and Engram row from the model's weights, the routers' own
  // choices.
  explicit Exec(const Backend& b) : be(b), experts(resident_experts()), engram(resident_engram()) {}
  Exec(const Backend& b, RoutedExperts& e, RoutingOverride* o = nullptr, EngramRows* g = nullptr)
      : be(b), experts(e), routing(o), engram(g != nullptr ? *g : resident_engram()) {}
};

}  // namespace strata
