#include "engine/gpu_tier.h"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <unistd.h>

#include "base/profiler.h"
#include "cpu/repack.h"
#include "storage/expert_store.h"
#include "gpu/cuda_device.h"
#include "gpu/cuda_kernels.h"
#include "gpu/sim_device.h"
#include "model/model.h"

namespace strata {

GpuTier::GpuTier(const Model& m, const Options& o, std::unique_ptr<gpu::Device> dev)
    : m_(m), o_(o), dev_(std::move(dev)) {}

GpuTier::~GpuTier() {
  if (!heat_file_.empty() && cache_ != nullptr)
    if (const Status st = save_heat(heat_file_); !st) std::fprintf(stderr, "strata: %s\n", st.error().message.c_str());
  if (cuda_ != nullptr) end_device_share(nullptr);
  cache_.reset();
  for (gpu::Device::Buffer& b : ship_)
    if (b.id >= 0) dev_->free(b);
  for (Scratch& s : dscratch_) gpu::device_free(s.p);
  for (auto& [host, dev] : biases_) gpu::device_free(dev);
  gpu::pinned_free(pin_in_.p);
  gpu::pinned_free(pin_out_.p);
}

uint64_t GpuTier::fixed_bytes(const Model& m) {
  // every tensor but the routed experts' matrices is read by every token
  uint64_t total = 0, experts = 0;
  for (const GgufTensorInfo& ti : m.file().tensors()) {
    total += ti.n_bytes;
    if (ti.name.ends_with("_exps.weight")) experts += ti.n_bytes;
  }
  return total - experts;
}

uint64_t GpuTier::scratch_bytes(const Model& m) {
  return uint64_t(512) * uint64_t(m.hparams().n_embd) * sizeof(float) * 16;
}

uint64_t GpuTier::slot_bytes(const Model& m) {
  uint64_t slot = 0;
  for (const LayerWeights& l : m.layers)
    if (l.is_moe()) slot = std::max<uint64_t>(slot, l.gate_exps.mat_bytes() + l.up_exps.mat_bytes() + l.down_exps.mat_bytes());
  return slot;
}

Result<std::unique_ptr<GpuTier>> GpuTier::create_simulated(const Model& m, const Options& o) {
  auto dev = std::make_unique<gpu::SimDevice>(o.vram_bytes, o.costs.pcie_gbps);
  gpu::SimDevice* sim = dev.get();
  auto t = create(m, o, std::move(dev));
  if (t) (*t)->sim_ = sim;
  return t;
}

Result<std::unique_ptr<GpuTier>> GpuTier::create_cuda(const Model& m, const Options& o) {
  auto dev = gpu::CudaDevice::create(o.vram_bytes);
  if (!dev) return dev.error();
  gpu::CudaDevice* cuda = dev->get();
  if (!cuda->note().empty()) std::fprintf(stderr, "strata: %s\n", cuda->note().c_str());
  auto t = create(m, o, std::move(*dev));
  if (!t) return t.error();
  (*t)->cuda_ = cuda;
  (*t)->done_event_ = cuda->new_event();
  std::string no_kernel;
  for (const LayerWeights& l : m.layers) {
    bool ok = l.is_moe();
    for (const Weight* w : {&l.gate_exps, &l.up_exps, &l.down_exps})
      if (ok && !gpu::cuda_has_matmul(w->type)) {
        ok = false;
        if (no_kernel.empty()) no_kernel = ggml_type_name(w->type);
      }
    (*t)->gpu_layer_.push_back(ok);
  }
  if (!no_kernel.empty())
    std::fprintf(stderr, "strata: GPU tier: routed experts of type %s have no CUDA kernel; their layers' experts "
                 "stay on the CPU\n", no_kernel.c_str());
  if (!cuda->error().empty()) return Error{"GPU tier: " + cuda->error()};
  return t;
}

Result<std::unique_ptr<GpuTier>> GpuTier::create(const Model& m, const Options& o, std::unique_ptr<gpu::Device> dev) {
  const HParams& hp = m.hparams();
  std::unique_ptr<GpuTier> t(new GpuTier(m, o, std::move(dev)));
  t->fixed_ = fixed_bytes(m);
  t->slot_bytes_ = slot_bytes(m);
  if (t->slot_bytes_ == 0) return Error{"the GPU tier caches routed experts, and this model has none"};
  const uint64_t scratch = scratch_bytes(m);
  gpu::Device& d = *t->dev_;
  // a real device ships experts through two staging slots of its own (the simulation only
  // costs the copies), when the budget has room for them beside the fixed part and scratch
  const bool cuda = dynamic_cast<gpu::SimDevice*>(t->dev_.get()) == nullptr;
  if (cuda && d.capacity() - d.used() >= t->fixed_ + scratch + 3 * t->slot_bytes_) {
    for (int i = 0; i < 2; ++i) {
      auto b = d.alloc(t->slot_bytes_);
      if (!b) break;
      t->ship_[i] = *b;
      t->ship_ready_[i] = d.new_event();
      t->ship_read_[i] = d.new_event();
    }
  }
  auto cache = gpu::VramExpertCache::create(d, t->fixed_, scratch, t->slot_bytes_, hp.n_layer,
                                            std::max(1, hp.n_expert), o.cache);
  if (!cache) return cache.error();
  t->cache_ = std::move(*cache);
  t->stream_ = d.compute_stream();
  return t;
}

gpu::SimDevice& GpuTier::device() {
  STRATA_CHECK(sim_ != nullptr, "GpuTier::device: the tier is not simulated");
  return *sim_;
}

void GpuTier::observe(int layer, std::span<const int32_t> ids) {
  if (cuda_ == nullptr || gpu_layer_[size_t(layer)]) cache_->observe(layer, ids);  // no slots for CPU-only layers
}

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
  LayerPlacement p = place_experts(jobs, o_.costs);
  // on a real device: all on the CPU after an error or where the GPU has no kernel for the
  // layer's expert types; shipping needs the staging slots
  if (cuda_ != nullptr)
    for (ExpertSite& site : p.site)
      if (!cuda_->error().empty() || !gpu_layer_[size_t(layer)] || (site == ExpertSite::ship && ship_[1].id < 0))
        site = ExpertSite::cpu;
  // streamed experts are not in host memory to ship from
  if (store_ != nullptr)
    for (ExpertSite& site : p.site)
      if (site == ExpertSite::ship) site = ExpertSite::cpu;
  counts_.model_cpu_s += p.cpu_s;
  counts_.model_gpu_s += p.gpu_s;
  counts_.model_copy_s += p.copy_s;
  counts_.model_total_s += p.total_s;
  std::vector<Assignment> out(experts.size());
  double layer_gpu_s = 0, layer_copy_s = 0;  // the layer's GPU share, for the profiler
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
      if (cuda_ != nullptr) {
        v.gate.interleaved = v.up.interleaved = v.down.interleaved = false;  // the file's layout
      } else if (store_ != nullptr) {  // simulated, promoted from the store's slot: its layout
        v.gate.interleaved = store_->interleaved(layer, 0);
        v.up.interleaved = store_->interleaved(layer, 1);
        v.down.interleaved = store_->interleaved(layer, 2);
      }
      out[i].views = v;
      const double seconds = o_.costs.gpu_seconds(bytes, params, n_tok[i]);
      counts_.gpu_seconds += seconds;
      layer_gpu_s += seconds;
      if (cuda_ != nullptr) {
        out[i].on_device = true;  // its kernels are issued by begin_device_share
        continue;
      }
      cache_->run(stream_, slots[i], seconds, nullptr);
    }
  }
  for (size_t i = 0; i < experts.size(); ++i) {
    if (p.site[i] != ExpertSite::ship) continue;
    ++counts_.ship_uses;
    counts_.ship_bytes += bytes;
    const double seconds = o_.costs.gpu_seconds(bytes, params, n_tok[i]);
    counts_.gpu_seconds += seconds;
    layer_gpu_s += seconds;
    layer_copy_s += o_.costs.copy_seconds(bytes);
    if (cuda_ != nullptr) {
      out[i].on_device = true;  // copied and computed by begin_device_share
      continue;
    }
    sim_->wait(stream_, sim_->transfer_h2d(cache_->copy_stream(), bytes));  // the one PCIe link, shared with promotions
    sim_->launch(stream_, {}, seconds, nullptr);
  }
  // the layer's GPU share on the profiler's links, as the placement models it
  const int64_t now = prof::now_ns();
  prof::record(prof::Part::experts, layer, prof::Link::pcie_h2d, now, int64_t(layer_copy_s * 1e9));
  prof::record(prof::Part::experts, layer, prof::Link::gpu, now + int64_t(layer_copy_s * 1e9), int64_t(layer_gpu_s * 1e9));
  return out;
}

void GpuTier::layer_done(double cpu_seconds) {
  if (sim_ == nullptr) return;  // a real device: end_device_share waited for the GPU's share
  sim_->host_advance(cpu_seconds);
  sim_->wait(stream_, sim_->host_time());
}


namespace {
constexpr const char* kHeatMagic = "strata-expert-heat 1";

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
  const int promoted = cache_->warm_start(heat, host_bytes());
  release_held();
  return promoted;
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

gpu::VramExpertCache::HostBytes GpuTier::host_bytes() {
  return [this](int layer, int e) {
    const LayerWeights& l = m_.layers[size_t(layer)];
    std::vector<std::span<const uint8_t>> pieces;
    deinterleaved_.resize(3);
    release_held();  // the previous expert's copies are done (copy_h2d returns once src is free)
    if (store_ != nullptr) {  // streamed experts: from the store's RAM slot, pinned until the next call
      held_ = store_->pin_if_in_ram(layer, e);
      if (!held_) return pieces;  // not in RAM: a candidate again later
      if (!held_->wait()) {       // bytes in (ready, or interleaved now); a failed read is not copied
        release_held();
        return pieces;
      }
    }
    const Weight* mats[3] = {&l.gate_exps, &l.up_exps, &l.down_exps};
    if (held_) mats[0] = &held_->gate, mats[1] = &held_->up, mats[2] = &held_->down;
    for (int k = 0; k < 3; ++k) {
      const Weight x = held_ ? *mats[k] : mats[k]->slice(e);
      // the simulation computes a slot with the CPU kernels (their layout: the bytes as they are);
      // the GPU's kernels read the file's: rows the loader interleaved are put back
      if (!x.interleaved || cuda_ == nullptr) {
        pieces.emplace_back(x.data, x.mat_bytes());
        continue;
      }
      std::vector<uint8_t>& file = deinterleaved_[size_t(k)];
      file.resize(x.mat_bytes());
      for (int64_t r = 0; r < x.n_out; ++r) {
        const uint8_t* row = cpu::file_row(x, r, 0, file.data() + size_t(r) * x.row_bytes);
        if (row != file.data() + size_t(r) * x.row_bytes) std::memcpy(file.data() + size_t(r) * x.row_bytes, row, x.row_bytes);
      }
      pieces.emplace_back(file.data(), file.size());
    }
    return pieces;
  };
}

void GpuTier::release_held() {
  if (held_) store_->release(std::span<const ExpertView>(&*held_, 1));
  held_.reset();
}

bool GpuTier::resident(int layer, int expert) const { return cache_->resident(layer, expert); }

void GpuTier::end_step() {
  const uint64_t before = sim_ != nullptr ? sim_->bytes_copied() : cuda_->bytes_copied();
  cache_->end_step(host_bytes());
  release_held();
  const uint64_t copied = (sim_ != nullptr ? sim_->bytes_copied() : cuda_->bytes_copied()) - before;
  // the step's promotions on the PCIe link, at the tier's rate
  prof::record(prof::Part::experts, -1, prof::Link::pcie_h2d, prof::now_ns(),
               int64_t(o_.costs.copy_seconds(copied) * 1e9));
}

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
  s.pcie_bytes = sim_ != nullptr ? sim_->bytes_copied() : cuda_->bytes_copied() + counts_.pcie_bytes;
  s.pcie_seconds = sim_ != nullptr ? sim_->pcie_seconds() : 0;
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
  return strfmt("GPU tier (%s, %s of VRAM: %s fixed, %" PRId64 " expert slots of %s for %" PRId64
                " experts, %s of KV): of %" PRIu64 " expert uses %.1f%% from VRAM, %.1f%% shipped (%s), %.1f%% on the "
                "CPU; %" PRIu64 " promotions, %" PRIu64 " evictions, %s over PCIe in all; modelled expert time "
                "(engine/expert_placement.h): CPU %.1f ms, GPU %.1f ms (copies %.1f ms), critical path %.1f ms",
                sim_ != nullptr ? "simulated device" : "CUDA device 0", format_size(s.vram_bytes).c_str(),
                format_size(s.fixed_bytes).c_str(), s.slots,
                format_size(s.slot_bytes).c_str(), s.n_experts, format_size(s.kv_bytes).c_str(), uses,
                pct(s.gpu_uses), pct(s.ship_uses), format_bytes(double(s.ship_bytes)).c_str(), pct(s.cpu_uses),
                s.promotions, s.evictions, format_bytes(double(s.pcie_bytes)).c_str(), 1e3 * s.model_cpu_s,
                1e3 * s.model_gpu_s, 1e3 * s.model_copy_s, 1e3 * s.model_total_s);
}


// ---- the device share of a layer, on a real GPU ----

void* GpuTier::scratch(int i, size_t bytes) {
  Scratch& s = dscratch_[i];
  if (s.bytes < bytes) {
    gpu::device_free(s.p);
    s = {};
    auto p = gpu::device_alloc(std::max(bytes, size_t(1) << 20));
    if (!p) return nullptr;  // out of device memory: this layer's share goes to the CPU
    s = {*p, std::max(bytes, size_t(1) << 20)};
  }
  return s.p;
}

bool GpuTier::pinned(Scratch& s, size_t bytes) {
  if (s.bytes >= bytes) return true;
  gpu::pinned_free(s.p);
  s = {};
  auto p = gpu::pinned_alloc(std::max(bytes, size_t(1) << 20));
  if (!p) return false;  // no pinned memory: this layer's share goes to the CPU
  s = {*p, std::max(bytes, size_t(1) << 20)};
  return true;
}

const float* GpuTier::device_bias(const Weight& b) {
  if (auto it = biases_.find(b.data); it != biases_.end()) return static_cast<const float*>(it->second);
  const size_t bytes = b.mat_bytes() * size_t(b.n_mat);
  auto p = gpu::device_alloc(bytes);
  if (!p) return nullptr;  // out of device memory: this layer's share goes to the CPU
  if (!cuda_->check(gpu::copy_to_device(*p, b.data, bytes))) {
    gpu::device_free(*p);
    return nullptr;
  }
  biases_[b.data] = *p;
  return static_cast<const float*>(*p);
}

void GpuTier::begin_device_share(const LayerWeights& l, int layer, std::span<const DeviceFfn> ffns, const float* h,
                                 int64_t n_tok, int64_t n_embd, const GluParams& glu) {
  STRATA_CHECK(cuda_ != nullptr && share_ == Share::none, "begin_device_share: a real device, one share at a time");
  gpu::CudaDevice& d = *cuda_;
  if (ffns.empty()) return;
  share_ = Share::failed;  // until every kernel and copy is issued
  share_rows_ = n_tok * n_embd;
  if (!d.error().empty()) return;
  const int64_t E = n_embd, F = l.gate_exps.n_out, E_in = l.gate_exps.n_in;
  size_t total = 0, most = 0;  // token rows of the share, of its largest expert
  for (const DeviceFfn& f : ffns) {
    total += f.tokens.size();
    most = std::max(most, f.tokens.size());
  }
  // one upload: h, then every expert's rows and scales
  const size_t h_bytes = size_t(n_tok * E_in) * sizeof(float), out_bytes = size_t(share_rows_) * sizeof(float);
  const size_t idx_bytes = total * sizeof(int32_t), sc_bytes = total * sizeof(float);
  if (!pinned(pin_in_, h_bytes + idx_bytes + sc_bytes) || !pinned(pin_out_, out_bytes)) return;
  auto* in = static_cast<uint8_t*>(pin_in_.p);
  std::memcpy(in, h, h_bytes);
  auto* idx = reinterpret_cast<int32_t*>(in + h_bytes);
  auto* sc = reinterpret_cast<float*>(in + h_bytes + idx_bytes);
  for (const DeviceFfn& f : ffns)
    for (size_t i = 0; i < f.tokens.size(); ++i) {
      *idx++ = int32_t(f.tokens[i]);
      *sc++ = f.scale[i];
    }
  auto* dh = static_cast<float*>(scratch(kH, h_bytes));
  auto* dout = static_cast<float*>(scratch(kOut, out_bytes));
  auto* dx = static_cast<float*>(scratch(kX, most * size_t(E_in) * sizeof(float)));
  auto* dg = static_cast<float*>(scratch(kG, most * size_t(F) * sizeof(float)));
  auto* du = static_cast<float*>(scratch(kU, most * size_t(F) * sizeof(float)));
  auto* dd = static_cast<float*>(scratch(kD, most * size_t(E) * sizeof(float)));
  auto* drows = static_cast<int32_t*>(scratch(kRows, idx_bytes + sc_bytes));  // then the scales
  void* const compute = d.stream_handle(stream_);
  bool ok = dh && dout && dx && dg && du && dd && drows &&
            d.check(gpu::copy_to_device_async(dh, in, h_bytes, compute)) &&
            d.check(gpu::copy_to_device_async(drows, in + h_bytes, idx_bytes + sc_bytes, compute)) &&
            d.check(gpu::memset_async(dout, 0, out_bytes, compute));
  const float* dscale = ok ? reinterpret_cast<const float*>(reinterpret_cast<const uint8_t*>(drows) + idx_bytes) : nullptr;
  counts_.pcie_bytes += h_bytes + idx_bytes + sc_bytes + out_bytes;
  const float* gate_b = l.gate_exps_b ? device_bias(l.gate_exps_b) : nullptr;
  const float* up_b = l.up_exps_b ? device_bias(l.up_exps_b) : nullptr;
  const float* down_b = l.down_exps_b ? device_bias(l.down_exps_b) : nullptr;
  ok = ok && (!l.gate_exps_b || gate_b) && (!l.up_exps_b || up_b) && (!l.down_exps_b || down_b);
  size_t at = 0;  // the expert's first row in drows / dscale
  for (const DeviceFfn& f : ffns) {
    if (!ok) break;
    const int64_t n = int64_t(f.tokens.size());
    const int32_t e = f.expert;
    // the expert's FFN over its gathered rows, scaled into dout (kernels in order on the compute stream)
    auto ffn = [&, n, e, at](const Weight& gate, const Weight& up, const Weight& down) {
      ok = d.check(gpu::cuda_gather_rows(dh, drows + at, n, E_in, dx)) &&
           d.check(gpu::cuda_matmul(gate.type, gate.data, F, E_in, gate.row_bytes, dx, n, dg)) &&
           d.check(gpu::cuda_matmul(up.type, up.data, F, E_in, up.row_bytes, dx, n, du)) &&
           d.check(gpu::cuda_add_rows(dg, gate_b ? gate_b + e * F : nullptr, n, F)) &&
           d.check(gpu::cuda_add_rows(du, up_b ? up_b + e * F : nullptr, n, F)) &&
           d.check(gpu::cuda_glu(int(glu.kind), glu.alpha, glu.limit, dg, du, n * F)) &&
           d.check(gpu::cuda_matmul(down.type, down.data, E, F, down.row_bytes, dg, n, dd)) &&
           d.check(gpu::cuda_add_rows(dd, down_b ? down_b + e * E : nullptr, n, E)) &&
           d.check(gpu::cuda_scatter_add_rows(dout, drows + at, dscale + at, n, E, dd));
    };
    if (f.site->views) {  // from its slot, after the slot's copy
      const Views& v = *f.site->views;
      cache_->run(stream_, v.slot, 0.0, [&] { ffn(v.gate, v.up, v.down); });
    } else {  // shipped: into a staging slot once the kernels reading its last expert are done
      const int j = next_ship_;
      next_ship_ ^= 1;
      gpu::Device::Buffer& b = ship_[j];
      d.wait_event(cache_->copy_stream(), ship_read_[j]);
      uint64_t off = 0;
      Weight w[3] = {l.gate_exps.slice(e), l.up_exps.slice(e), l.down_exps.slice(e)};
      for (const std::span<const uint8_t> piece : host_bytes()(layer, e)) {
        d.copy_h2d(cache_->copy_stream(), b, off, piece.data(), piece.size());
        off += piece.size();
      }
      d.record_event(ship_ready_[j], cache_->copy_stream());
      d.wait_event(stream_, ship_ready_[j]);
      for (Weight& x : w) x.interleaved = false;
      w[0].data = b.data;
      w[1].data = b.data + w[0].mat_bytes();
      w[2].data = b.data + w[0].mat_bytes() + w[1].mat_bytes();
      ffn(w[0], w[1], w[2]);
      d.record_event(ship_read_[j], stream_);
      ok = ok && d.error().empty();
    }
    at += size_t(n);
  }
  ok = ok && d.check(gpu::copy_to_host_async(pin_out_.p, dout, out_bytes, compute));
  d.record_event(done_event_, stream_);
  if (ok && d.error().empty()) share_ = Share::issued;
}

bool GpuTier::end_device_share(float* out) {
  STRATA_CHECK(cuda_ != nullptr, "end_device_share: a real device");
  const Share state = share_;
  share_ = Share::none;
  if (state == Share::none) return true;
  if (state == Share::failed || !cuda_->synchronize(done_event_)) return false;
  if (out != nullptr) {
    const auto* d = static_cast<const float*>(pin_out_.p);
    for (int64_t i = 0; i < share_rows_; ++i) out[i] += d[i];
  }
  return true;
}

}  // namespace strata
