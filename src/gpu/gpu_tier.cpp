#include "gpu/gpu_tier.h"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <unistd.h>

#include "model/model.h"

namespace strata {

GpuTier::GpuTier(const Model& m, const Options& o) : m_(m), o_(o), dev_(o.vram_bytes, o.costs.pcie_gbps) {}

GpuTier::~GpuTier() {
  if (heat_file_.empty() || cache_ == nullptr) return;
  if (const Status st = save_heat(heat_file_); !st) std::fprintf(stderr, "strata: %s\n", st.error().message.c_str());
}

Result<std::unique_ptr<GpuTier>> GpuTier::create_simulated(const Model& m, const Options& o) {
  const HParams& hp = m.hparams();
  std::unique_ptr<GpuTier> t(new GpuTier(m, o));
  // every tensor but the routed experts' matrices is read by every token; slots fit the largest
  // expert (quant mixes give some layers' ffn_down more bits)
  uint64_t total = 0, experts = 0;
  for (const GgufTensorInfo& ti : m.file().tensors()) {
    total += ti.n_bytes;
    if (ti.name.ends_with("_exps.weight")) experts += ti.n_bytes;
  }
  t->fixed_ = total - experts;
  int n_moe = 0;
  for (const LayerWeights& l : m.layers) {
    if (!l.is_moe()) continue;
    ++n_moe;
    t->slot_bytes_ = std::max<uint64_t>(t->slot_bytes_, l.gate_exps.mat_bytes() + l.up_exps.mat_bytes() +
                                                            l.down_exps.mat_bytes());
  }
  if (n_moe == 0) return Error{"the GPU tier caches routed experts, and this model has none"};
  const uint64_t scratch = uint64_t(512) * uint64_t(hp.n_embd) * sizeof(float) * 16;
  auto cache = gpu::VramExpertCache::create(t->dev_, t->fixed_, scratch, t->slot_bytes_, hp.n_layer,
                                            std::max(1, hp.n_expert), o.cache);
  if (!cache) return cache.error();
  t->cache_ = std::move(*cache);
  t->stream_ = t->dev_.new_stream();
  return t;
}

void GpuTier::observe(int layer, std::span<const int32_t> ids) { cache_->observe(layer, ids); }

std::vector<GpuTier::Assignment> GpuTier::place(const LayerWeights& l, int layer, std::span<const int32_t> experts,
                                                std::span<const int64_t> n_tok) {
  STRATA_CHECK(experts.size() == n_tok.size());
  const uint64_t bytes = l.gate_exps.mat_bytes() + l.up_exps.mat_bytes() + l.down_exps.mat_bytes();
  const uint64_t params = uint64_t(l.gate_exps.n_in * l.gate_exps.n_out + l.up_exps.n_in * l.up_exps.n_out +
                                   l.down_exps.n_in * l.down_exps.n_out);
  std::vector<ExpertJob> jobs(experts.size());
  std::vector<int> slots(experts.size(), -1);
  for (size_t i = 0; i < experts.size(); ++i) {
    slots[i] = cache_->ready_slot(layer, experts[i], stream_);
    jobs[i] = {.expert = experts[i], .n_tok = n_tok[i], .resident = slots[i] >= 0, .bytes = bytes, .params = params};
  }
  const LayerPlacement p = place_experts(jobs, o_.costs);
  counts_.model_cpu_s += p.cpu_s;
  counts_.model_gpu_s += p.gpu_s;
  counts_.model_copy_s += p.copy_s;
  counts_.model_total_s += p.total_s;
  std::vector<Assignment> out(experts.size());
  // the GPU share on the timeline: kernels from slots first, then each shipped expert's kernel
  // after its copy (the order place_experts costs)
  for (size_t i = 0; i < experts.size(); ++i) {
    out[i].site = p.site[i];
    if (p.site[i] == ExpertSite::cpu) {
      ++counts_.cpu_uses;
    } else if (p.site[i] == ExpertSite::gpu) {
      ++counts_.gpu_uses;
      Views v;
      v.slot = slots[i];
      const uint8_t* at = cache_->slot_data(slots[i]);
      v.gate = l.gate_exps.slice(0);
      v.gate.data = at;
      v.up = l.up_exps.slice(0);
      v.up.data = at + l.gate_exps.mat_bytes();
      v.down = l.down_exps.slice(0);
      v.down.data = at + l.gate_exps.mat_bytes() + l.up_exps.mat_bytes();
      out[i].views = v;
      const double seconds = o_.costs.gpu_seconds(bytes, params, n_tok[i]);
      cache_->run(stream_, slots[i], seconds, nullptr);
      counts_.gpu_seconds += seconds;
    }
  }
  for (size_t i = 0; i < experts.size(); ++i) {
    if (p.site[i] != ExpertSite::ship) continue;
    ++counts_.ship_uses;
    counts_.ship_bytes += bytes;
    dev_.wait(stream_, dev_.transfer_h2d(cache_->copy_stream(), bytes));  // the one PCIe link, shared with promotions
    const double seconds = o_.costs.gpu_seconds(bytes, params, n_tok[i]);
    dev_.launch(stream_, {}, seconds, nullptr);
    counts_.gpu_seconds += seconds;
  }
  return out;
}

void GpuTier::layer_done(double cpu_seconds) {
  dev_.host_advance(cpu_seconds);
  dev_.wait(stream_, dev_.host_time());
}


namespace {
constexpr const char* kHeatMagic = "strata-expert-heat 1";

gpu::VramExpertCache::HostBytes host_bytes(const Model& m) {
  return [&m](int layer, int e) {
    const LayerWeights& l = m.layers[size_t(layer)];
    std::vector<std::span<const uint8_t>> pieces;
    for (const Weight* w : {&l.gate_exps, &l.up_exps, &l.down_exps}) pieces.emplace_back(w->slice(e).data, w->mat_bytes());
    return pieces;
  };
}
}  // namespace

Result<int> GpuTier::load_heat(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Error{strfmt("gpu.heat_file %s: cannot read it: %s", path.c_str(), std::strerror(errno))};
  const int L = m_.hparams().n_layer, E = std::max(1, m_.hparams().n_expert);
  std::string magic;
  std::getline(in, magic);
  std::string w_layers, w_experts;
  long long layers = -1, experts = -1;
  if (magic != kHeatMagic || !(in >> w_layers >> layers >> w_experts >> experts) || w_layers != "layers" ||
      w_experts != "experts")
    return Error{strfmt("gpu.heat_file %s: not a routing-statistics file strata wrote (first line \"%s\")",
                        path.c_str(), kHeatMagic)};
  if (layers != L || experts != E)
    return Error{strfmt("gpu.heat_file %s: counts for %lld layers x %lld experts, this model has %d x %d", path.c_str(),
                        layers, experts, L, E)};
  std::vector<double> heat(size_t(L) * size_t(E));
  for (size_t i = 0; i < heat.size(); ++i)
    if (!(in >> heat[i]) || !std::isfinite(heat[i]) || heat[i] < 0)
      return Error{strfmt("gpu.heat_file %s: count %zu of %zu is missing or not a non-negative number", path.c_str(),
                          i + 1, heat.size())};
  return cache_->warm_start(heat, host_bytes(m_));
}

Status GpuTier::save_heat(const std::string& path) const {
  const std::string tmp = strfmt("%s.tmp.%d", path.c_str(), int(::getpid()));
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return Error{strfmt("gpu.heat_file %s: cannot write it: %s", tmp.c_str(), std::strerror(errno))};
    const int L = m_.hparams().n_layer, E = std::max(1, m_.hparams().n_expert);
    out << kHeatMagic << "\nlayers " << L << " experts " << E << "\n";
    const std::vector<double>& h = cache_->heat_table();
    for (int l = 0; l < L; ++l) {
      for (int e = 0; e < E; ++e) out << (e ? " " : "") << strfmt("%.6g", h[size_t(l) * size_t(E) + size_t(e)]);
      out << "\n";
    }
    if (!out.flush()) {
      std::remove(tmp.c_str());
      return Error{strfmt("gpu.heat_file %s: write failed", tmp.c_str())};
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    return Error{strfmt("gpu.heat_file %s: cannot replace it: %s", path.c_str(), std::strerror(e))};
  }
  return {};
}

void GpuTier::end_step() { cache_->end_step(host_bytes(m_)); }

void GpuTier::set_kv(const void* session, uint64_t bytes) {
  if (bytes == 0)
    kv_.erase(session);
  else
    kv_[session] = bytes;
  uint64_t sum = 0;
  for (const auto& [s, b] : kv_) sum += b;
  if (cache_->set_kv_bytes(sum).ok()) {
    kv_overflow_ = 0;
    return;
  }
  const uint64_t most = cache_->max_kv_bytes();
  STRATA_CHECK(cache_->set_kv_bytes(most).ok(), "GpuTier: the arena's own room does not fit");
  kv_overflow_ = sum - std::min(sum, most);
}

GpuTier::Stats GpuTier::stats() const {
  Stats s = counts_;  // the tier's own counts; the rest from the cache and the device
  s.promotions = cache_->promotions();
  s.evictions = cache_->evictions();
  s.stalls = cache_->stalls();
  s.pcie_bytes = dev_.bytes_copied();
  s.pcie_seconds = dev_.pcie_seconds();
  s.slots = cache_->n_slots();
  s.resident = cache_->n_resident();
  s.n_experts = int64_t(m_.hparams().n_expert) * std::count_if(m_.layers.begin(), m_.layers.end(),
                                                               [](const LayerWeights& l) { return l.is_moe(); });
  s.kv_bytes = cache_->kv_bytes();
  s.kv_overflow_bytes = kv_overflow_;
  s.vram_bytes = o_.vram_bytes;
  s.fixed_bytes = fixed_;
  s.slot_bytes = slot_bytes_;
  return s;
}

std::string GpuTier::summary() const {
  const Stats s = stats();
  const uint64_t uses = s.gpu_uses + s.ship_uses + s.cpu_uses;
  auto pct = [&](uint64_t n) { return uses ? 100.0 * double(n) / double(uses) : 0.0; };
  return strfmt("GPU tier (simulated device, %s of VRAM: %s fixed, %" PRId64 " expert slots of %s for %" PRId64
                " experts, %s of KV): of %" PRIu64 " expert uses %.1f%% from VRAM, %.1f%% shipped (%s), %.1f%% on the "
                "CPU; %" PRIu64 " promotions, %" PRIu64 " evictions, %s over PCIe in all; modelled expert time "
                "(engine/expert_placement.h): CPU %.1f ms, GPU %.1f ms (copies %.1f ms), critical path %.1f ms",
                format_size(s.vram_bytes).c_str(), format_size(s.fixed_bytes).c_str(), s.slots,
                format_size(s.slot_bytes).c_str(), s.n_experts, format_size(s.kv_bytes).c_str(), uses,
                pct(s.gpu_uses), pct(s.ship_uses), format_bytes(double(s.ship_bytes)).c_str(), pct(s.cpu_uses),
                s.promotions, s.evictions, format_bytes(double(s.pcie_bytes)).c_str(), 1e3 * s.model_cpu_s,
                1e3 * s.model_gpu_s, 1e3 * s.model_copy_s, 1e3 * s.model_total_s);
}

}  // namespace strata
