#include "engine/expert_placement.h"

#include <algorithm>
#include <numeric>

#include "base/error.h"

namespace strata {

double ExpertCosts::cpu_seconds(uint64_t bytes, uint64_t params, int64_t n_tok) const {
  return std::max(double(bytes) / (cpu_gbps * 1e9), 2.0 * double(params) * double(n_tok) / cpu_ops);
}

double ExpertCosts::gpu_seconds(uint64_t bytes, uint64_t params, int64_t n_tok) const {
  return std::max(double(bytes) / (vram_gbps * 1e9), 2.0 * double(params) * double(n_tok) / gpu_ops) + launch_s;
}

double ExpertCosts::copy_seconds(uint64_t bytes) const { return double(bytes) / (pcie_gbps * 1e9); }

bool ExpertCosts::ships_alone(uint64_t bytes, uint64_t params, int64_t n_tok) const {
  return copy_seconds(bytes) + gpu_seconds(bytes, params, n_tok) < cpu_seconds(bytes, params, n_tok);
}

int64_t ExpertCosts::ship_break_even(uint64_t bytes, uint64_t params) const {
  // both sides grow linearly in n past their memory-bound part; search the doubling, then bisect
  auto ships = [&](int64_t n) { return ships_alone(bytes, params, n); };
  int64_t hi = 1;
  while (!ships(hi)) {
    if (hi > (int64_t(1) << 40)) return 0;
    hi *= 2;
  }
  int64_t lo = hi / 2;  // !ships(lo) unless hi == 1
  if (hi == 1) return 1;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (ships(mid) ? hi : lo) = mid;
  }
  return hi;
}

std::string ExpertCosts::describe() const {
  return strfmt("CPU %.1f GB/s, %.0f GOP/s; PCIe %.1f GB/s; GPU %.0f GB/s, %.0f TOP/s", cpu_gbps, cpu_ops / 1e9,
                pcie_gbps, vram_gbps, gpu_ops / 1e12);
}

namespace {

// The GPU share: copies in order on one stream; resident kernels, then each shipped kernel after
// its copy, on the other.
double gpu_share(std::span<const ExpertJob> jobs, const std::vector<ExpertSite>& site, const ExpertCosts& c,
                 double* copies) {
  double t = 0, copied = 0;
  for (size_t i = 0; i < jobs.size(); ++i)
    if (site[i] == ExpertSite::gpu) t += c.gpu_seconds(jobs[i].bytes, jobs[i].params, jobs[i].n_tok);
  for (size_t i = 0; i < jobs.size(); ++i)
    if (site[i] == ExpertSite::ship) {
      copied += c.copy_seconds(jobs[i].bytes);
      t = std::max(t, copied) + c.gpu_seconds(jobs[i].bytes, jobs[i].params, jobs[i].n_tok);
    }
  if (copies != nullptr) *copies = copied;
  return t;
}

}  // namespace

LayerPlacement place_experts(std::span<const ExpertJob> jobs, const ExpertCosts& c) {
  STRATA_CHECK(c.pcie_gbps > 0 && c.vram_gbps > 0 && c.gpu_ops > 0, "expert placement needs the GPU's rates");
  const bool cpu_known = c.cpu_gbps > 0 && c.cpu_ops > 0;
  LayerPlacement p;
  p.site.resize(jobs.size(), ExpertSite::cpu);
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (jobs[i].resident) {
      p.site[i] = ExpertSite::gpu;
    } else if (cpu_known) {
      p.cpu_s += c.cpu_seconds(jobs[i].bytes, jobs[i].params, jobs[i].n_tok);
    }
  }
  p.gpu_s = gpu_share(jobs, p.site, c, &p.copy_s);
  if (!cpu_known) {  // nothing to compare shipping with: the CPU keeps what is not resident
    p.total_s = std::max(p.cpu_s, p.gpu_s);
    return p;
  }
  // candidates: non-resident experts that would ship on their own, most tokens first
  std::vector<size_t> cand;
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (jobs[i].resident) continue;
    if (c.ships_alone(jobs[i].bytes, jobs[i].params, jobs[i].n_tok)) cand.push_back(i);
  }
  std::stable_sort(cand.begin(), cand.end(), [&](size_t a, size_t b) { return jobs[a].n_tok > jobs[b].n_tok; });
  for (size_t i : cand) {
    p.site[i] = ExpertSite::ship;
    double cpu_after = 0;  // summed again, not subtracted: an emptied CPU share is exactly 0
    for (size_t j = 0; j < jobs.size(); ++j)
      if (p.site[j] == ExpertSite::cpu) cpu_after += c.cpu_seconds(jobs[j].bytes, jobs[j].params, jobs[j].n_tok);
    double copies = 0;
    const double gpu_after = gpu_share(jobs, p.site, c, &copies);
    if (std::max(cpu_after, gpu_after) < std::max(p.cpu_s, p.gpu_s)) {
      p.cpu_s = cpu_after;
      p.gpu_s = gpu_after;
      p.copy_s = copies;
    } else {
      p.site[i] = ExpertSite::cpu;
    }
  }
  p.total_s = std::max(p.cpu_s, p.gpu_s);
  return p;
}

}  // namespace strata
