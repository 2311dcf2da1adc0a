// The routed experts over the engine's tiers (model/experts.h RoutedExperts): the VRAM cache of
// the GPU tier (engine/gpu_tier.h) and the NVMe tier's RAM cache of experts streamed from the file
// (storage/expert_store.h). Without either, every expert comes from the model's weights.
//
// Today one tier at a time: with the expert store, each layer's experts are acquired from it
// (reads start for those not in RAM; the look-ahead's predictions go to it); with the GPU tier,
// the experts its VRAM cache holds ready run from their slots (a real GPU computes its share while
// the CPU computes the rest). The engine refuses both at once (engine.cpp).
#pragma once

#include <span>

#include "model/experts.h"

namespace strata {

struct ExpertBatch;
class ExpertStore;
class GpuTier;

class TieredExperts final : public RoutedExperts {
 public:
  // Not owned; either may be null. They outlive this object.
  TieredExperts(ExpertStore* store, GpuTier* gpu) : store_(store), gpu_(gpu) {}

  int lookahead_depth() const override;
  void prefetch(int layer, int distance, std::span<const int32_t> experts) override;
  void run(const cpu::Matmul& mm, const LayerWeights& l, int il, const Routing& r, const float* h, int64_t n_tok,
           int64_t n_embd, const GluParams& glu, float* out) override;

 private:
  void run_streamed(const cpu::Matmul& mm, int il, ExpertBatch& batch, const float* h, int64_t n_tok,
                    const GluParams& glu, float* out);
  void run_gpu(const cpu::Matmul& mm, const LayerWeights& l, int il, const Routing& r, ExpertBatch& batch,
               const float* h, int64_t n_tok, int64_t n_embd, const GluParams& glu, float* out);
  ExpertStore* store_;
  GpuTier* gpu_;
};

}  // namespace strata
