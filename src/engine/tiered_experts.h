// The routed experts over the engine's tiers (model/experts.h RoutedExperts): the VRAM cache of
// the GPU tier (engine/gpu_tier.h) and the NVMe tier's RAM cache of experts streamed from the file
// (storage/expert_store.h). Without either, every expert comes from the model's weights.
//
// Either or both (three tiers at once): the GPU tier places each active expert (its VRAM slot, or
// the CPU); the CPU's experts come from the expert store when the experts are streamed (reads
// start for those not in RAM; the look-ahead's predictions of experts without a VRAM slot go to
// it), else from the model's weights. Promotions into VRAM copy from the store's RAM slots
// (GpuTier::stream_from).
#pragma once

#include <span>

#include "model/blocks.h"
#include "model/experts.h"

namespace strata {

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
  // The experts the host computes, in id order: streamed[i] when the expert store is to give
  // work[i]'s weights (set when acquired), else they are set already.
  struct HostShare {
    std::vector<int32_t> ids;
    std::vector<char> streamed;
    std::vector<FfnWork> work;
    void add(int32_t id, bool from_store, FfnWork&& f) {
      ids.push_back(id);
      streamed.push_back(from_store);
      work.push_back(std::move(f));
    }
  };
  void run_host(const cpu::Matmul& mm, int il, HostShare& host, const float* h, int64_t n_tok, const GluParams& glu,
                float* out);
  ExpertStore* store_;
  GpuTier* gpu_;
};

}  // namespace strata
