// Where each active routed expert of a layer runs (issue #7, ../shared/DESIGN.md "Cost model"):
// on the GPU from its VRAM slot, on the CPU from host memory, or shipped to the GPU over PCIe for
// this step. A pure function of (the layer's routing, residency, costs): no I/O, no device calls.
//
// Per expert of P parameters in S bytes serving n tokens:
//   CPU          t_cpu  = max(S / B_cpu, 2 P n / F_cpu)
//   GPU resident t_gpu  = max(S / B_vram, 2 P n / F_gpu) + launch
//   GPU shipped  t_ship = S / B_pcie, then t_gpu
// The CPU share and the GPU share of a layer run at the same time. The GPU share is two streams:
// copies in order on one, and on the other the resident experts' kernels, then each shipped
// expert's kernel once its copy has landed. The layer lasts the longer share. Resident
// experts always run on the GPU. A non-resident expert is shipped only when that shortens the
// layer, taken in order of tokens served (the ones that gain most first). At decode (one token an
// expert) a copy over PCIe costs more than the CPU reading the expert from DRAM wherever DRAM is
// faster than PCIe (every workstation: 50-300 GB/s against 25-64), so nothing ships; in prefill,
// experts past the break-even batch do.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace strata {

struct ExpertCosts {
  double cpu_gbps = 0;       // CPU kernels reading expert weights from RAM (hardware.weights_gbps)
  double cpu_ops = 0;        // CPU prefill GEMM, ops/s (hardware.cpu_int8_gops * 1e9)
  double pcie_gbps = 0;      // host to device (hardware.pcie_h2d_gbps)
  double vram_gbps = 0;      // GPU reading weights (hardware.gpu_gbps)
  double gpu_ops = 0;        // GPU on quantized weights, ops/s (hardware.gpu_tflops * 1e12)
  double launch_s = 5e-6;    // one kernel launch

  double cpu_seconds(uint64_t bytes, uint64_t params, int64_t n_tok) const;
  double gpu_seconds(uint64_t bytes, uint64_t params, int64_t n_tok) const;
  double copy_seconds(uint64_t bytes) const;
  // Whether shipping one expert alone (copy + kernel) beats the CPU at n_tok tokens.
  bool ships_alone(uint64_t bytes, uint64_t params, int64_t n_tok) const;
  // The fewest tokens for which shipping one expert alone (copy + kernel) beats the CPU; 0 when no
  // batch does (the GPU is slower than the CPU at any size).
  int64_t ship_break_even(uint64_t bytes, uint64_t params) const;
  std::string describe() const;
};

enum class ExpertSite : uint8_t { gpu, ship, cpu };

struct ExpertJob {
  int32_t expert = 0;
  int64_t n_tok = 0;
  bool resident = false;  // its VRAM slot is ready
  uint64_t bytes = 0, params = 0;
};

struct LayerPlacement {
  std::vector<ExpertSite> site;  // per job
  double cpu_s = 0;              // the CPU share
  double gpu_s = 0;              // the GPU share: copies and kernels, pipelined
  double copy_s = 0;             // of which copies over PCIe
  double total_s = 0;            // max(cpu_s, gpu_s)
};

// Needs the GPU's rates. Without the CPU's (0), nothing ships and the CPU share is not modelled
// (cpu_s = 0).
LayerPlacement place_experts(std::span<const ExpertJob> jobs, const ExpertCosts& c);

}  // namespace strata
