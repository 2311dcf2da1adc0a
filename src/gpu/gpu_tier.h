// The GPU tier's routed experts on the simulated device (issue #7, docs/gpu.md). The VRAM cache
// (vram_cache.h) keeps the hottest experts in slots; moe_ffn computes a routed expert from its
// slot when the slot is ready (its copy has landed) and from host memory otherwise. On the
// simulated device both run on the CPU kernels. The slot's copy holds the same bytes, so the
// results equal the CPU-only path bit for bit. A GPU kernel is costed on the device's timeline
// as the expert's bytes over the VRAM bandwidth. The dense part (attention, shared experts, head)
// stays on the CPU: there is no Backend interface yet.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>

#include "base/error.h"
#include "gpu/sim_device.h"
#include "gpu/vram_cache.h"
#include "model/weights.h"

namespace strata {

class Model;
struct LayerWeights;

class GpuTier {
 public:
  struct Options {
    uint64_t vram_bytes = 0;  // budgets.vram
    double pcie_gbps = 25;    // host-to-device copies (hardware.pcie_h2d_gbps)
    double vram_gbps = 900;   // GPU kernels read expert weights at this rate (hardware.gpu_gbps)
    gpu::VramCacheParams cache;
  };
  // The arena for `m`: fixed = every weight but the routed experts, scratch = activations of a
  // 512-token batch, slots of the largest expert. Errors: the budget cannot hold the fixed part.
  static Result<std::unique_ptr<GpuTier>> create_simulated(const Model& m, const Options& o);

  // moe_ffn: one layer's routing (the cache's heat).
  void observe(int layer, std::span<const int32_t> ids);
  // The expert's matrices in its VRAM slot when the slot is ready, else nullopt (the CPU computes
  // it from host memory). `l` is the layer's weights (types and shapes of the views).
  struct Views {
    Weight gate, up, down;
    int slot = -1;
  };
  std::optional<Views> on_gpu(const LayerWeights& l, int layer, int expert);
  // The expert of `slot` was computed for n_tok tokens: a kernel on the GPU stream.
  void ran_on_gpu(int slot, int64_t n_tok);
  // The CPU's share of a layer took `seconds` (host time moves on); the GPU share of the layer
  // is waited for before the next.
  void layer_done(double cpu_seconds);
  // After a forward pass: promotions.
  void end_step();
  // A session's KV cache now holds `bytes`: the arena's KV part is the sum over sessions (0: the
  // session is gone). Beyond what the arena can give, the KV part stays at its most and the
  // excess is counted (kv_overflow_bytes): the real KV cache is in host memory, so nothing fails.
  void set_kv(const void* session, uint64_t bytes);

  struct Stats {
    uint64_t gpu_uses = 0, cpu_uses = 0;  // expert computations, by where they ran
    uint64_t promotions = 0, evictions = 0, stalls = 0;
    uint64_t pcie_bytes = 0;
    double pcie_seconds = 0, gpu_seconds = 0;
    int64_t slots = 0, resident = 0, n_experts = 0;
    uint64_t kv_bytes = 0, kv_overflow_bytes = 0, vram_bytes = 0, fixed_bytes = 0, slot_bytes = 0;
  };
  Stats stats() const;
  // "GPU tier (simulated, 8.0 GiB): 41% of 1234 expert uses from VRAM, ..." (one line).
  std::string summary() const;
  gpu::SimDevice& device() { return dev_; }

 private:
  GpuTier(const Model& m, const Options& o);
  const Model& m_;
  Options o_;
  gpu::SimDevice dev_;
  std::unique_ptr<gpu::VramExpertCache> cache_;
  int stream_ = -1;
  uint64_t fixed_ = 0, slot_bytes_ = 0;
  std::map<const void*, uint64_t> kv_;  // per session
  uint64_t kv_overflow_ = 0;
  uint64_t gpu_uses_ = 0, cpu_uses_ = 0;
  double gpu_seconds_ = 0;
};

}  // namespace strata
