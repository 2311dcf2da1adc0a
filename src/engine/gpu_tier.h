// The GPU tier's routed experts (issue #7, docs/gpu.md), on the simulated device or on a real GPU
// (CudaDevice). The VRAM cache (vram_cache.h) keeps the hottest experts in slots. Each layer,
// place() decides per active expert (engine/expert_placement.h, from the tier's costs): from its
// slot on the GPU when the slot is ready (its copy has landed), shipped to the GPU for this step
// when that shortens the layer (prefill batches past the break-even), else on the CPU from host
// memory.
//
// Simulated: every expert is computed by the CPU kernels, a resident one from its slot (the slot
// holds the same bytes, so the results equal the CPU-only path bit for bit), a shipped one from
// host memory; the GPU's kernels and copies are costed on the device's timeline.
// CUDA: the experts placed on the GPU (resident, or shipped through one of two staging slots) are
// the device share of the layer: begin_device_share() issues their kernels on the compute stream
// and returns, the CPU computes its share meanwhile, and end_device_share() adds the device's
// output. The hidden state crosses PCIe once each way per layer. The dense part runs on the
// Backend (CudaBackend on a GPU).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "base/error.h"
#include "engine/expert_placement.h"
#include "gpu/device.h"
#include "gpu/sim_device.h"
#include "gpu/vram_cache.h"
#include "storage/expert_store.h"
#include "cpu/weights.h"

namespace strata {

namespace gpu {
class CudaDevice;
}  // namespace gpu
class Model;
struct LayerWeights;
struct GluParams;

class GpuTier {
 public:
  struct Options {
    uint64_t vram_bytes = 0;  // budgets.vram
    // The GPU's rates (assumed on a real GPU too; nothing measures one yet): PCIe copies, VRAM reads, throughput on quantized weights (an
    // RTX 3090's class unless hardware.pcie_h2d_gbps / gpu_gbps / gpu_tflops say otherwise), and
    // the CPU's, which the caller fills from the calibration (hardware.weights_gbps,
    // cpu_int8_gops): place() compares them.
    ExpertCosts costs{.cpu_gbps = 0, .cpu_ops = 0, .pcie_gbps = 25, .vram_gbps = 900, .gpu_ops = 140e12};
    gpu::VramCacheParams cache;
  };
  // The arena for `m`: fixed = every weight but the routed experts, scratch = activations of a
  // 512-token batch, slots of the largest expert. Errors: the budget cannot hold the fixed part,
  // the model has no routed experts.
  static Result<std::unique_ptr<GpuTier>> create_simulated(const Model& m, const Options& o);
  // The same on CUDA device 0. Errors as above, and no usable device.
  static Result<std::unique_ptr<GpuTier>> create_cuda(const Model& m, const Options& o);
  // The arena's fixed part for `m`: the bytes of every tensor but the routed experts'.
  static uint64_t fixed_bytes(const Model& m);
  // Its scratch: the activations of a 512-token batch.
  static uint64_t scratch_bytes(const Model& m);
  // One expert slot: the largest routed expert's gate, up and down (quant mixes give some layers'
  // ffn_down more bits); 0 when the model has no routed experts.
  static uint64_t slot_bytes(const Model& m);
  // A budget that holds the fixed part, scratch and `slots` expert slots.
  static uint64_t arena_bytes(const Model& m, int slots) {
    return fixed_bytes(m) + scratch_bytes(m) + uint64_t(slots) * slot_bytes(m);
  }

  // TieredExperts::run: one layer's routing (the cache's heat).
  void observe(int layer, std::span<const int32_t> ids);
  // Where each of a layer's active experts runs, with n_tok[i] tokens for experts[i]. Simulated,
  // the GPU's share (kernels from slots, copies and kernels of shipped experts) goes on the
  // device's timeline; on CUDA, begin_device_share issues it. `l` is the layer's weights (types
  // and shapes of the views).
  struct Views {
    Weight gate, up, down;
    int slot = -1;
  };
  struct Assignment {
    ExpertSite site = ExpertSite::cpu;
    std::optional<Views> views;  // site gpu: the expert's matrices in its VRAM slot
    bool on_device = false;      // CUDA: computed in the device share (begin_device_share)
  };
  std::vector<Assignment> place(const LayerWeights& l, int layer, std::span<const int32_t> experts,
                                std::span<const int64_t> n_tok);
  // CUDA: issues the layer's device share, the experts whose Assignment::on_device is set
  // (ffns: one per such expert, in `sites` order of place()'s experts): h [n_tok][n_embd] goes to
  // the device once, each expert's tokens are gathered there, its FFN runs from its slot (or
  // from a staging slot its copy fills, if shipped), and the scaled outputs are summed on the
  // device. Returns at once.
  struct DeviceFfn {
    int32_t expert = 0;
    const Assignment* site = nullptr;
    std::span<const int64_t> tokens;  // rows of h
    std::span<const float> scale;     // per token
  };
  void begin_device_share(const LayerWeights& l, int layer, std::span<const DeviceFfn> ffns, const float* h,
                          int64_t n_tok, int64_t n_embd, const GluParams& glu);
  // Waits for the device share and adds its output to out [n_tok][n_embd]. false (out unchanged):
  // a CUDA error (the device is off from now on) or no memory for the share's buffers (this layer
  // only); the caller computes those experts itself.
  bool end_device_share(float* out);
  bool on_cuda() const { return cuda_ != nullptr; }

  // The routed experts' host copies are the NVMe tier's (three tiers at once): promotions copy an
  // expert from its RAM slot in `store` (pinned for the copy; an expert not in RAM is not promoted
  // until it is), and nothing is shipped (an expert's bytes are in RAM only while the store holds
  // them). Not owned; it outlives the tier.
  void stream_from(ExpertStore* store) {
    release_held();
    store_ = store;
  }
  // Whether (layer, expert) has a VRAM slot (its copy may still be in flight).
  bool resident(int layer, int expert) const;

  // Simulated: the CPU's share of a layer took `seconds` (host time moves on); the GPU share of
  // the layer is waited for before the next. On CUDA nothing (end_device_share waited).
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
  // excess is counted (kv_overflow_bytes): the KV cache is the host's (a CUDA backend's mirror of
  // it is its own memory), so nothing fails.
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
  // The simulated device (the tier must be simulated).
  gpu::SimDevice& device();
  // The rates its placement compares (the simulated device's, or assumed for a real GPU).
  const ExpertCosts& costs() const { return o_.costs; }

 private:
  GpuTier(const Model& m, const Options& o, std::unique_ptr<gpu::Device> dev);
  static Result<std::unique_ptr<GpuTier>> create(const Model& m, const Options& o, std::unique_ptr<gpu::Device> dev);
  gpu::VramExpertCache::HostBytes host_bytes();
  // The device copy of a stacked bias (f32 [n_expert][width]), made on first use; null on error.
  const float* device_bias(const Weight& b);
  const Model& m_;
  Options o_;
  std::unique_ptr<gpu::Device> dev_;
  gpu::SimDevice* sim_ = nullptr;    // dev_ when simulated
  gpu::CudaDevice* cuda_ = nullptr;  // dev_ on a GPU
  std::vector<bool> gpu_layer_;      // CUDA: [layer] a MoE layer whose expert types have kernels
  // CUDA: the device share's buffers (device, and pinned host), grown as needed
  struct Scratch {
    void* p = nullptr;
    size_t bytes = 0;
  };
  enum { kH, kOut, kX, kG, kU, kD, kRows, kDeviceScratch };
  Scratch dscratch_[kDeviceScratch];
  Scratch pin_in_, pin_out_;
  void* scratch(int i, size_t bytes);
  bool pinned(Scratch& s, size_t bytes);
  std::map<const void*, void*> biases_;
  gpu::Device::Buffer ship_[2];  // staging slots of shipped experts
  int ship_ready_[2] = {-1, -1}, ship_read_[2] = {-1, -1};
  int next_ship_ = 0;
  int done_event_ = -1;  // the device share's output is on the host
  enum class Share { none, failed, issued } share_ = Share::none;  // the layer's device share
  int64_t share_rows_ = 0;                                         // its output: n_tok * n_embd
  std::vector<std::vector<uint8_t>> deinterleaved_;  // host_bytes's file-layout copies
  ExpertStore* store_ = nullptr;                     // stream_from
  // host_bytes's expert of the store, pinned while the cache copies it (until the next call or
  // the end of the step)
  std::optional<ExpertView> held_;
  void release_held();
  std::unique_ptr<gpu::VramExpertCache> cache_;
  int stream_ = -1;
  uint64_t fixed_ = 0, slot_bytes_ = 0;
  std::map<const void*, uint64_t> kv_;  // per session
  uint64_t kv_overflow_ = 0;
  std::string heat_file_;
  Stats counts_;  // what place() counts: uses, shipped bytes, GPU and modelled seconds
};

}  // namespace strata
