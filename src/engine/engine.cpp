#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "base/profiler.h"
#include "cpu/calibrate.h"
#include "cpu/thread_pool.h"
#include "engine/engram_tier.h"
#include "engine/gpu_tier.h"
#include "engine/session.h"
#include "engine/tiered_experts.h"
#include "gpu/cuda_backend.h"
#include "gpu/cuda_kernels.h"
#include "gpu/gpu_devices.h"
#include "storage/expert_store.h"

namespace strata {

namespace {

// The compute pool's NUMA layout from the config's [numa] (STRATA_TOPOLOGY in the environment
// stands in for numa.topology when that is empty).
Status configure_numa(const Config& c) {
  cpu::NumaOptions o = c.numa;
  if (o.topology.empty())
    if (const char* env = std::getenv("STRATA_TOPOLOGY"); env != nullptr) o.topology = env;
  if (auto r = cpu::set_numa(o); !r) return Error{"config " + c.source + ": numa: " + r.error().message};
  return {};
}

ModelSummary summary_of(const Model& m) {
  auto s = summarize_model(m.file());
  STRATA_CHECK(bool(s), "a loaded model's file summarizes");
  return std::move(*s);
}

}  // namespace

ExpertLayout expert_layout(const Model& m) {
  ExpertLayout layout;
  layout.n_expert = m.hparams().n_expert;
  layout.n_expert_used = m.hparams().n_expert_used;
  layout.file = m.file().bytes_;
  layout.repack = m.streamed_repack;
  for (const LayerWeights& l : m.layers) layout.stacks.push_back({l.gate_exps, l.up_exps, l.down_exps});
  return layout;
}

Engine::Engine(std::unique_ptr<Model> model, const Config& config, ModelSummary summary)
    : model_(std::move(model)), config_(config), summary_(std::move(summary)),
      experts_(std::make_unique<TieredExperts>(nullptr, nullptr)) {}

Engine::Engine(std::unique_ptr<Model> model) : Engine(std::move(model), Config{}, ModelSummary{}) {
  summary_ = summary_of(*model_);
}

Engine::~Engine() = default;  // the members' order is the tiers' (engine.h)

// The routed experts over whichever tiers there are; the GPU tier promotes from the store's RAM
// slots when the experts are streamed.
void Engine::wire_tiers() {
  if (gpu_) gpu_->stream_from(store_.get());
  experts_ = std::make_unique<TieredExperts>(store_.get(), gpu_.get());
}

void Engine::set_expert_store(std::unique_ptr<ExpertStore> store) {
  if (gpu_) gpu_->stream_from(nullptr);  // before the old store goes
  store_ = std::move(store);
  wire_tiers();
}

void Engine::set_gpu_tier(std::unique_ptr<GpuTier> gpu) {
  gpu_ = std::move(gpu);
  wire_tiers();
}

void Engine::set_backend(std::unique_ptr<Backend> backend) { backend_ = std::move(backend); }

RoutedExperts& Engine::experts() const { return *experts_; }

Engine::TierStats Engine::tier_stats() const {
  TierStats t;
  // the GPU tier places every use (VRAM, or host memory); the store serves the host's uses of
  // streamed experts (RAM, or a read from the file)
  if (gpu_) {
    const GpuTier::Stats g = gpu_->stats();
    t.uses = g.gpu_uses + g.ship_uses + g.cpu_uses;
    t.vram = g.gpu_uses;
    t.ram = g.ship_uses + g.cpu_uses;
    t.promotions = g.promotions;
    t.pcie_bytes = g.pcie_bytes;
  }
  if (store_) {
    const ExpertStoreStats st = store_->stats();
    const uint64_t in_ram = uint64_t(st.hits - st.prefetch_used);  // found in RAM without a read for this use
    const uint64_t read = uint64_t(st.accesses) - in_ram;
    if (!gpu_) t.uses = t.ram = uint64_t(st.accesses);
    t.ram -= std::min(t.ram, read);
    t.nvme = read;
    t.nvme_bytes = st.bytes_read;
  }
  return t;
}

Status Engine::take_error() const {
  Status experts = store_ ? store_->take_error() : Status::success();
  Status engram = engram_store_ ? engram_store_->take_error() : Status::success();
  return experts.ok() ? engram : experts;
}

EngramRows* Engine::engram() const { return engram_.get(); }

void Engine::set_engram_store(std::unique_ptr<RowStore> store) {
  engram_.reset();
  engram_store_ = std::move(store);
  if (engram_store_) engram_ = std::make_unique<StreamedEngram>(*model_, *engram_store_);
}

void Engine::end_step(std::span<Session* const> sessions) const {
  if (!gpu_ || sessions.empty()) return;
  prof::Span span(prof::Part::tier_step);
  const uint64_t per_token = kv_bytes_per_token(model_->hparams(), sessions[0]->kv_type());
  for (Session* s : sessions) gpu_->set_kv(s, per_token * uint64_t(s->n_past()));
  gpu_->end_step();
}

void Engine::session_closed(const Session* session) const {
  if (gpu_) gpu_->set_kv(session, 0);
}

Result<std::unique_ptr<Engine>> Engine::open(const Config& c, const char* cmd) {
  const auto t0 = std::chrono::steady_clock::now();
  // the header alone (mapped, nothing read) says what the budgets must hold
  auto header = GgufFile::open(c.model_path, MappedFile::Mode::mmap);
  if (!header) return header.error();
  auto s = summarize_model(*header);
  if (!s) return s.error();
  auto hp = hparams_from_gguf(*header);
  if (!hp) return hp.error();
  const int64_t ctx_for_budget = c.ctx > 0 ? std::min<int64_t>(c.ctx, std::max(hp->n_ctx_train, 1))
                                           : std::min<int64_t>(4096, std::max(hp->n_ctx_train, 1));
  const int n_gpus = c.vram_budget > 0 ? int(list_gpu_devices().devices.size()) : 0;
  auto budget = check_budgets(c, *s, kv_bytes_per_token(*hp, c.kv_type) * uint64_t(ctx_for_budget), system_memory(), n_gpus);
  if (!budget) return budget.error();
  for (const std::string& note : budget->notes) std::fprintf(stderr, "%s: %s\n", cmd, note.c_str());

  if (c.threads > 0) cpu::set_compute_threads(c.threads);
  cpu::set_compute_pin(c.pin);
  STRATA_TRY(configure_numa(c));
  const bool stream = budget->expert_cache_bytes > 0;
  // routed experts in VRAM: the GPU tier, on the simulated device or on a real GPU
  const bool has_experts = hp->n_expert > 0;
  const bool real_gpu = c.vram_budget > 0 && !c.gpu_simulate && n_gpus > 0;
  const bool gpu_tier = c.vram_budget > 0 && has_experts && (c.gpu_simulate || real_gpu);
  auto m = Model::load(c.model_path, budget->load, c.repack, stream, c.engram_tables == "stream");
  if (!m) return m.error();
  auto engine = std::make_unique<Engine>(std::move(*m), c, *s);
  const Model& model = engine->model();
  std::string how = model.file().load_mode() == MappedFile::Mode::ram ? "read into RAM" : "mapped";
  // a mapped file that fits in the memory available: its pages read on a background thread, so
  // that the first request does not pay a fault per page (llama.cpp populates its mapping too)
  if (!stream && model.file().load_mode() == MappedFile::Mode::mmap && s->n_bytes <= system_memory().available &&
      model.file().populate_in_background())
    how += ", its pages read into memory in the background";
  if (stream) {
    ExpertStoreOptions so;
    so.cache_bytes = budget->expert_cache_bytes;
    so.queue_depth = c.queue_depth;
    so.prefetch_depth = c.prefetch_depth;
    so.policy.kind = *parse_cache_policy(c.cache_policy);  // the config accepts only known names
    auto store = ExpertStore::open(expert_layout(model), c.model_path, so);
    if (!store) return store.error();
    engine->set_expert_store(std::move(*store));
    const ExpertStore& st = *engine->expert_store();
    how = strfmt("%s resident, routed experts streamed: %" PRId64 " slots of %.1f MiB, %s",
                 format_bytes(double(model.resident_bytes)).c_str(), st.n_slots(), double(st.slot_bytes()) / 0x1p20,
                 std::string(st.read_method()).c_str());
    if (model.engram_streamed) {
      RowStoreOptions ro;
      ro.cache_bytes = budget->engram_cache_bytes;
      // random 4 KiB reads want a deeper queue than 1 MiB expert reads (bench --engram-reads: the
      // store reached 0.91 of the probe at 64 on the development box, 0.60 at 128)
      ro.queue_depth = std::max(c.queue_depth, 64);
      auto rows = RowStore::open(engram_tables(model), c.model_path, ro);
      if (!rows) return rows.error();
      engine->set_engram_store(std::move(*rows));
      how += strfmt("; Engram tables streamed: a row cache of %" PRId64 " rows (%s)", engine->engram_store()->n_slots(),
                    format_bytes(double(budget->engram_cache_bytes)).c_str());
    }
  }
  if (gpu_tier) {
    GpuTier::Options go;
    go.vram_bytes = c.vram_budget;
    go.cache.max_promotions = c.gpu_max_promotions;
    // the simulated GPU's rates unless [hardware] states them; the CPU's from the calibration, or
    // probed now (strata calibrate keeps them), for the placement's comparison
    auto limits = resolve_limits(c);
    if (!limits) return limits.error();
    const HardwareLimits& hw = limits->limits;
    if (hw.pcie_h2d_gbps > 0) go.costs.pcie_gbps = hw.pcie_h2d_gbps;
    if (hw.gpu_gbps > 0) go.costs.vram_gbps = hw.gpu_gbps;
    if (hw.gpu_tflops > 0) go.costs.gpu_ops = hw.gpu_tflops * 1e12;
    go.costs.cpu_gbps = hw.weights_gbps > 0 ? hw.weights_gbps : hw.dram_gbps;
    go.costs.cpu_ops = hw.cpu_int8_gops * 1e9;
    if (go.costs.cpu_gbps <= 0) go.costs.cpu_gbps = cpu::measure_read_gbps(cpu::compute_pool());
    if (go.costs.cpu_ops <= 0) go.costs.cpu_ops = cpu::measure_int8_peak_gops(cpu::compute_pool()) * 1e9;
    auto tier = real_gpu ? GpuTier::create_cuda(model, go) : GpuTier::create_simulated(model, go);
    if (!tier) return Error{"config " + c.source + ": " + tier.error().message};
    engine->set_gpu_tier(std::move(*tier));
    GpuTier& gpu = *engine->gpu_tier();
    if (!c.gpu_heat_file.empty()) {
      std::error_code ec;
      if (std::filesystem::exists(c.gpu_heat_file, ec)) {
        auto warm = gpu.load_heat(c.gpu_heat_file);
        if (!warm) return Error{"config " + c.source + ": " + warm.error().message};
        how += strfmt(", warm start: %d experts from %s", *warm, c.gpu_heat_file.c_str());
      }
      gpu.save_heat_at_exit(c.gpu_heat_file);
    }
    const GpuTier::Stats st = gpu.stats();
    how += strfmt(", %s: %" PRId64 " expert slots of %s for %" PRId64 " experts (%s)",
                  real_gpu ? "GPU tier on CUDA device 0" : "simulated GPU", st.slots, format_size(st.slot_bytes).c_str(),
                  st.n_experts, go.costs.describe().c_str());
  }
  if (real_gpu) {
    // the dense part's weights: the tier's fixed part of the budget (all of it without a tier)
    auto be = CudaBackend::create(engine->gpu_tier() ? GpuTier::fixed_bytes(model) : c.vram_budget);
    if (!be) return Error{"config " + c.source + ": budgets.vram: " + be.error().message};
    engine->set_backend(std::move(*be));
    how += ", dense part on the CUDA backend (large batches: " + gpu::cuda_gemm_library() + ")";
  }
  {
    std::string skipped;
    const cpu::PlacementStats placed = place_in_numa(model, cpu::numa_layout(), &skipped);
    if (cpu::numa_layout().topology().n_nodes() > 1 || cpu::numa_layout().n_groups() > 1)
      std::fprintf(stderr, "%s: %s; weights: %s\n", cmd, cpu::numa_layout().describe().c_str(),
                   skipped.empty() ? placed.describe(cpu::numa_layout()).c_str() : skipped.c_str());
  }
  if (model.repacked_bytes > 0)
    how += strfmt(", %s repacked in %.2f s", format_bytes(double(model.repacked_bytes)).c_str(), model.repack_seconds);
  std::fprintf(stderr, "%s: loaded %s (%s, %s) in %.2f s (%s), %d threads%s\n", cmd, c.model_path.c_str(),
               s->arch.c_str(), format_bytes(double(s->n_bytes)).c_str(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), how.c_str(),
               cpu::compute_pool().size(), c.source == "defaults" ? "" : (", config " + c.source).c_str());
  if (const int n = model.hparams().n_nextn; n > 0) {
    if (model.mtp != nullptr)
      std::fprintf(stderr, "%s: the file has %d multi-token-prediction (nextn) layer%s; the first drafts with "
                   "--draft mtp\n", cmd, n, n == 1 ? "" : "s");
    else
      std::fprintf(stderr, "%s: %s\n", cmd, model.mtp_error.c_str());
  }
  return engine;
}

}  // namespace strata
