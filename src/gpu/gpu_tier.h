// The GPU tier's routed experts on the simulated device (issue #7, docs/gpu.md). The VRAM cache
// (vram_cache.h) keeps the hottest experts in slots. Each layer, place() decides per active expert
// (engine/expert_placement.h, from the tier's costs): from its slot on the GPU when the slot is
// ready (its copy has landed), shipped to the GPU for this step when that shortens the layer
// (prefill batches past the break-even), else on the CPU from host memory. On the simulated
// device every expert is computed by the CPU kernels: a resident one from its slot (the slot's
// copy holds the same bytes, so the results equal the CPU-only path bit for bit), a shipped one
// from host memory; the GPU's kernels and copies are costed on the device's timeline. The dense
// part (attention, shared experts, head) stays on the CPU: there is no Backend interface yet.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "base/error.h"
#include "engine/expert_placement.h"
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
    // The simulated GPU's rates: PCIe copies, VRAM reads, throughput on quantized weights (an
    // RTX 3090's class unless hardware.pcie_h2d_gbps / gpu_gbps / gpu_tflops say otherwise), and
    // the CPU's, which the caller fills from the calibration (hardware.weights_gbps,
    // cpu_int8_gops): place() compares them.
    ExpertCosts costs{.cpu_gbps = 0, .cpu_ops = 0, .pcie_gbps = 25, .vram_gbps = 900, .gpu_ops = 140e12};
    gpu::VramCacheParams cache;
  };
  // The arena for `m`: fixed = every weight but the routed experts, scratch = activations of a
  // 512-token batch, slots of the largest expert. Errors: the budget cannot hold the fixed part.
  static Result<std::unique_ptr<GpuTier>> create_simulated(const Model& m, const Options& o);

  // moe_ffn: one layer's routing (the cache's heat).
  void observe(int layer, std::span<const int32_t> ids);
  // Where each of a layer's active experts runs, with n_tok[i] tokens for experts[i]; the GPU's
  // share (kernels from slots, copies and kernels of shipped experts) goes on the device's
  // timeline. `l` is the layer's weights (types and shapes of the views).
  struct Views {
    Weight gate, up, down;
    int slot = -1;
  };
  struct Assignment {
    ExpertSite site = ExpertSite::cpu;
    std::optional<Views> views;  // site gpu: the expert's matrices in its VRAM slot
  };
  std::vector<Assignment> place(const LayerWeights& l, int layer, std::span<const int32_t> experts,
                                std::span<const int64_t> n_tok);
  // The CPU's share of a layer took `seconds` (host time moves on); the GPU share of the layer
  // is waited for before the next.
  void layer_done(double cpu_seconds);
  // After a forward pass: promotions.
  void end_step();

  // Warm start (gpu.heat_file): the routing counts an earlier run saved, for this model's shape;
  // the hottest experts are promoted at once. Errors: unreadable or malformed file, another shape
  // (named in the message). Returns the experts promoted.
  Result<int> load_heat(const std::string& path);
  // Writes the current counts for a later load_heat (text; replaced atomically).
  Status save_heat(const std::string& path) const;
  // Where the destructor saves the counts ("" : nowhere); a failure is one line on stderr.
  void save_heat_at_exit(std::string path) { heat_file_ = std::move(path); }
  ~GpuTier();
  // A session's KV cache now holds `bytes`: the arena's KV part is the sum over sessions (0: the
  // session is gone). Beyond what the arena can give, the KV part stays at its most and the
  // excess is counted (kv_overflow_bytes): the real KV cache is in host memory, so nothing fails.
  void set_kv(const void* session, uint64_t bytes);

  struct Stats {
    uint64_t gpu_uses = 0, ship_uses = 0, cpu_uses = 0;  // expert computations, by where they ran
    uint64_t ship_bytes = 0;                             // shipped experts' bytes over PCIe
    // the layers' modelled shares (place_experts), summed: CPU, GPU (copies and kernels), of which
    // copies, and the critical path (the longer share of each layer)
    double model_cpu_s = 0, model_gpu_s = 0, model_copy_s = 0, model_total_s = 0;
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
  std::string heat_file_;
  Stats counts_;  // what place() counts: uses, shipped bytes, GPU and modelled seconds
};

}  // namespace strata
