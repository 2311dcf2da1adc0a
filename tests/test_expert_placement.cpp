// Per-layer expert placement (engine/expert_placement.h): resident experts on the GPU; at decode
// nothing ships (a PCIe copy costs more than the CPU reading the expert from DRAM); in prefill,
// experts past the break-even batch ship when that shortens the layer; the GPU share is the two
// streams' schedule; without the CPU's rates nothing ships.
#include <gtest/gtest.h>

#include <random>

#include "engine/expert_placement.h"

namespace strata {
namespace {

// An RTX 3090 box: DDR at 40 GB/s, 300 int8 GOP/s on the CPU, PCIe 4.0.
ExpertCosts box() {
  return {.cpu_gbps = 40, .cpu_ops = 300e9, .pcie_gbps = 25, .vram_gbps = 900, .gpu_ops = 140e12, .launch_s = 5e-6};
}

// Qwen3-30B-A3B's expert at Q4_K_M: 3 x 2048 x 768 parameters, about 2.6 MB.
constexpr uint64_t kParams = 3ull * 2048 * 768, kBytes = 2650000;

ExpertJob job(int e, int64_t n, bool resident) {
  return {.expert = e, .n_tok = n, .resident = resident, .bytes = kBytes, .params = kParams};
}

TEST(ExpertPlacement, DecodeNeverShips) {
  std::vector<ExpertJob> jobs;
  for (int e = 0; e < 8; ++e) jobs.push_back(job(e, 1, e % 3 == 0));
  const LayerPlacement p = place_experts(jobs, box());
  for (size_t i = 0; i < jobs.size(); ++i)
    EXPECT_EQ(p.site[i], jobs[i].resident ? ExpertSite::gpu : ExpertSite::cpu) << i;
  EXPECT_EQ(p.copy_s, 0.0);
  EXPECT_NEAR(p.cpu_s, 5 * double(kBytes) / 40e9, 1e-12);  // five experts read from DRAM
  EXPECT_DOUBLE_EQ(p.total_s, std::max(p.cpu_s, p.gpu_s));
}

TEST(ExpertPlacement, BreakEvenIsTheFirstBatchThatShips) {
  const ExpertCosts c = box();
  const int64_t n = c.ship_break_even(kBytes, kParams);
  ASSERT_GT(n, 1);
  auto ships = [&](int64_t t) { return c.copy_seconds(kBytes) + c.gpu_seconds(kBytes, kParams, t) < c.cpu_seconds(kBytes, kParams, t); };
  EXPECT_TRUE(ships(n));
  EXPECT_FALSE(ships(n - 1));
  // a GPU slower than the CPU at any batch: never
  ExpertCosts slow = c;
  slow.gpu_ops = 1e9;
  slow.pcie_gbps = 1;
  EXPECT_EQ(slow.ship_break_even(kBytes, kParams), 0);
}

TEST(ExpertPlacement, PrefillShipsTheBusyExperts) {
  const ExpertCosts c = box();
  const int64_t n = c.ship_break_even(kBytes, kParams);
  // one expert far past the break-even, three below it, two resident
  const std::vector<ExpertJob> jobs = {job(0, 40 * n, false), job(1, n / 2, false), job(2, 1, false),
                                       job(3, 2, false), job(4, 300, true), job(5, 7, true)};
  const LayerPlacement p = place_experts(jobs, c);
  EXPECT_EQ(p.site[0], ExpertSite::ship);
  EXPECT_EQ(p.site[1], ExpertSite::cpu);
  EXPECT_EQ(p.site[2], ExpertSite::cpu);
  EXPECT_EQ(p.site[3], ExpertSite::cpu);
  EXPECT_EQ(p.site[4], ExpertSite::gpu);
  EXPECT_EQ(p.site[5], ExpertSite::gpu);
  // shorter than keeping it on the CPU
  double all_cpu = 0;
  for (int i = 0; i < 4; ++i) all_cpu += c.cpu_seconds(kBytes, kParams, jobs[size_t(i)].n_tok);
  EXPECT_LT(p.total_s, all_cpu);
  EXPECT_NEAR(p.copy_s, c.copy_seconds(kBytes), 1e-15);
}

// The GPU share is the two-stream schedule: resident kernels, then each shipped kernel after its copy.
TEST(ExpertPlacement, GpuShareIsTheStreamsSchedule) {
  ExpertCosts c = box();
  c.cpu_ops = 1e9;  // a very slow CPU: everything that can ships
  const std::vector<ExpertJob> jobs = {job(0, 64, true), job(1, 512, false), job(2, 256, false)};
  const LayerPlacement p = place_experts(jobs, c);
  ASSERT_EQ(p.site[1], ExpertSite::ship);
  ASSERT_EQ(p.site[2], ExpertSite::ship);
  const double k0 = c.gpu_seconds(kBytes, kParams, 64), k1 = c.gpu_seconds(kBytes, kParams, 512),
               k2 = c.gpu_seconds(kBytes, kParams, 256), cp = c.copy_seconds(kBytes);
  const double t1 = std::max(k0, cp) + k1;
  const double t2 = std::max(t1, 2 * cp) + k2;
  EXPECT_NEAR(p.gpu_s, t2, 1e-15);
  EXPECT_NEAR(p.copy_s, 2 * cp, 1e-15);
  EXPECT_EQ(p.cpu_s, 0.0);
}

// Shipping only ever shortens the layer: never longer than keeping every non-resident expert on
// the CPU, on random batches.
TEST(ExpertPlacement, NeverWorseThanNotShipping) {
  std::mt19937 rng(7);
  const ExpertCosts c = box();
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<ExpertJob> jobs;
    const int m = 1 + int(rng() % 40);
    for (int e = 0; e < m; ++e) jobs.push_back(job(e, 1 + int64_t(rng() % 600), rng() % 4 == 0));
    const LayerPlacement p = place_experts(jobs, c);
    double cpu = 0, gpu = 0;
    for (const ExpertJob& j : jobs)
      (j.resident ? gpu : cpu) += j.resident ? c.gpu_seconds(j.bytes, j.params, j.n_tok) : c.cpu_seconds(j.bytes, j.params, j.n_tok);
    EXPECT_LE(p.total_s, std::max(cpu, gpu) * (1 + 1e-12)) << "trial " << trial;
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (jobs[i].resident) {
        EXPECT_EQ(p.site[i], ExpertSite::gpu);
      }
    }
  }
}

TEST(ExpertPlacement, UnknownCpuRatesShipNothing) {
  ExpertCosts c = box();
  c.cpu_gbps = 0;
  const std::vector<ExpertJob> jobs = {job(0, 4096, false), job(1, 1, true)};
  const LayerPlacement p = place_experts(jobs, c);
  EXPECT_EQ(p.site[0], ExpertSite::cpu);
  EXPECT_EQ(p.site[1], ExpertSite::gpu);
  EXPECT_EQ(p.cpu_s, 0.0);
}

}  // namespace
}  // namespace strata
