// The tier planner: from a model's tensor inventory (its GGUF header: no weight is read), the
// budgets of a config and the limits of a machine, decide what lives in VRAM, RAM and on NVMe, and
// predict decode and prefill speed with the split of time between CPU, GPU, PCIe and NVMe. A pure
// function of its inputs (no I/O), so its decisions are unit-tested on fixed inputs.
//
// The cost model is ../shared/DESIGN.md's: an expert of P parameters in S bytes serving n tokens
// costs max(S / B_ram, 2 P n / F_cpu) on the CPU, 2 P n / F_gpu on the GPU when resident,
// S / B_pcie more when shipped, and S / B_nvme more when it must first come from disk.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "engine/config.h"
#include "model/gguf.h"

namespace strata {

// What the planner needs to know about a model, per layer.
struct PlanModel {
  std::string name;
  std::string arch;
  int n_embd = 0;
  int n_vocab = 0;
  int n_expert = 0;       // routed experts per MoE layer (0: dense model)
  int n_expert_used = 0;
  uint64_t embd_bytes = 0;    // token embeddings: one row read per token, kept in RAM
  uint64_t output_bytes = 0;  // output head (+ final norm)
  uint64_t output_params = 0;
  struct Layer {
    uint64_t fixed_bytes = 0;   // attention, router, norms, dense / shared FFN: read every token
    uint64_t fixed_params = 0;
    uint64_t expert_bytes = 0;  // one routed expert (0: no experts in this layer)
    uint64_t expert_params = 0;
    uint64_t kv_bytes_per_token = 0;
  };
  std::vector<Layer> layers;
  // deepseek41's Engram tables: their bytes (outside the layers' fixed parts), the rows one token
  // reads of them and a row's bytes
  uint64_t engram_bytes = 0;
  uint64_t engram_rows_per_token = 0;
  uint64_t engram_row_bytes = 0;

  uint64_t total_bytes() const;
  uint64_t expert_bytes_total() const;
};

// Reads the inventory from a GGUF header (a real file or a header-only synthetic one); the KV
// cache with `kv` entries.
Result<PlanModel> plan_model_from_gguf(const GgufFile& f, KvType kv = KvType::f16);
// The same for a synthetic shape (`strata synth --list`) at a quant mix (q8_0, q4_k, mxfp4), from
// the header the synth writer would write: for a model the user does not have.
Result<PlanModel> plan_model_for_shape(std::string_view shape, std::string_view quant, KvType kv = KvType::f16);

struct PlanOptions {
  int64_t ctx = 4096;      // KV cache positions planned for (their bytes: PlanModel's kv_bytes_per_token)
  int prompt_tokens = 512;  // prefill prediction
  // GPU-side work buffers, reserved out of budgets.vram when there is a GPU
  uint64_t vram_scratch = uint64_t(512) << 20;
  // one CPU <-> GPU hand-over of the hidden state (copy + synchronisation), per direction per layer
  double handover_us = 10.0;
  // one kernel launch per routed expert computed on the GPU (as the placement's cost model has it)
  double expert_launch_us = 5.0;
  // Shares of routed-expert uses that hit VRAM and RAM in decode, measured (strata replay) instead
  // of the uniform-routing default (each tier serves the share of experts it holds). Both or none.
  std::optional<double> hit_vram, hit_ram;
  // Experts promoted into the VRAM cache per decoded token, measured; unset: gpu.max_promotions
  // every step while the VRAM holds only part of the routed experts (the steady state of a cache
  // that keeps finding hotter experts, as measured runs show).
  std::optional<double> promotions_per_token;
};

struct Placement {
  // VRAM
  int gpu_layers = 0;            // layers whose fixed part (and KV cache) is on the GPU: [0, gpu_layers)
  bool output_on_gpu = false;
  uint64_t vram_fixed = 0;       // fixed parts + output head on the GPU
  uint64_t vram_kv = 0;
  uint64_t vram_scratch = 0;
  uint64_t vram_experts = 0;     // bytes of routed experts cached in VRAM
  int64_t experts_in_vram = 0;   // over all layers
  // RAM
  uint64_t ram_fixed = 0;        // embeddings + fixed parts of CPU layers (+ output head)
  uint64_t ram_kv = 0;
  uint64_t ram_experts = 0;
  int64_t experts_in_ram = 0;
  // NVMe
  uint64_t nvme_experts = 0;
  int64_t experts_on_nvme = 0;
  int64_t experts_total = 0;
  // deepseek41's Engram tables: wholly in RAM, or on NVMe with a RAM row cache
  uint64_t ram_engram = 0;         // tables in RAM
  uint64_t engram_cache = 0;       // the row cache (tables on NVMe)
  uint64_t nvme_engram = 0;
};

// Predicted time of one step, split by resource. `total` is the critical path; the parts can sum
// to more when they overlap (NVMe prefetch under compute, GPU and CPU experts side by side).
struct StepTime {
  double total_s = 0;
  double cpu_s = 0, gpu_s = 0, pcie_s = 0, nvme_s = 0;
  double tok_per_s = 0;
  uint64_t ram_bytes = 0, vram_bytes = 0, pcie_bytes = 0, nvme_bytes = 0;  // per token (decode) or per step
};

struct Plan {
  Placement placement;
  double hit_vram = 0, hit_ram = 0, miss_nvme = 0;  // share of routed-expert uses served by each tier
  double engram_hit = 1;  // share of Engram rows found in RAM
  StepTime decode;
  StepTime prefill;
  std::vector<std::string> notes;  // assumptions and decisions, one line each
};

// Places and predicts. Errors name the config key that cannot be satisfied (a RAM budget below
// the CPU-side fixed part, a missing limit the prediction needs).
Result<Plan> make_plan(const PlanModel& m, const Config& c, const HardwareLimits& hw, const PlanOptions& o);

}  // namespace strata
