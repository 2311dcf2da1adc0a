#include "cli/common.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <map>

#include "cpu/calibrate.h"
#include "cpu/thread_pool.h"
#include "gpu/cuda_backend.h"
#include "gpu/cuda_kernels.h"
#include "gpu/gpu_devices.h"
#include "gpu/gpu_tier.h"
#include "storage/expert_store.h"

namespace strata::cli {

void add_common(CLI::App* sub, CommonOptions& o) {
  sub->add_option("-c,--config", o.config_path, "TOML config (presets in configs/; keys in docs/config.md)");
  sub->add_option("--set", o.sets, "override one config key, e.g. --set budgets.ram=16GiB (repeatable)");
  sub->add_option("-m,--model", o.model, "GGUF model (default: model.path, else the bundled tiny qwen3moe)");
  sub->add_option("-t,--threads", o.threads, "CPU threads (cpu.threads; default: all cores)")->check(CLI::NonNegativeNumber);
  sub->add_option("--ctx", o.ctx, "context length cap (model.ctx; default: the model's)")->check(CLI::PositiveNumber);
  sub->add_option("--load", o.load,
                  "weights into memory (model.load): ram (read into huge pages: faster decode), mmap (page "
                  "cache: instant start), auto (default: ram when the file fits in 80% of available memory)")
      ->check(CLI::IsMember({"auto", "ram", "mmap"}));
}

void add_draft_options(CLI::App* sub, DraftOptions& o) {
  sub->add_option("--draft", o.drafter,
                  "speculative decoding: none (default), ngram (prompt lookup) or mtp (the model's own "
                  "multi-token-prediction layer, where the GGUF has one); drafts are verified in one batched "
                  "pass, and the number drafted adapts to what is accepted");
  sub->add_option("--draft-max", o.max, "most tokens drafted per step (default 8)")->check(CLI::Range(1, 32));
}

Result<Config> resolve_config(const CommonOptions& o) {
  std::vector<ConfigOverride> overrides;
  for (const std::string& s : o.sets) {
    auto ov = parse_override(s);
    if (!ov) return ov.error();
    overrides.push_back(std::move(*ov));
  }
  // flags name keys too; they come last, so they win
  auto quoted = [](const std::string& s) {
    std::string q = "\"";
    for (char ch : s) {
      if (ch == '"' || ch == '\\') q += '\\';
      q += ch;
    }
    return q + "\"";
  };
  if (o.model) overrides.push_back({"model.path", quoted(*o.model)});
  if (o.threads) overrides.push_back({"cpu.threads", std::to_string(*o.threads)});
  if (o.ctx) overrides.push_back({"model.ctx", std::to_string(*o.ctx)});
  if (o.load) overrides.push_back({"model.load", quoted(*o.load)});
  auto c = load_config(o.config_path, overrides);
  if (!c) return c.error();
  if (c->model_path.empty()) c->model_path = STRATA_DEFAULT_MODEL;
  return c;
}

int64_t context_limit(const Model& m, const Config& c, int64_t fallback) {
  int64_t ctx = m.hparams().n_ctx_train > 0 ? m.hparams().n_ctx_train : 4096;
  if (c.ctx > 0) return std::min<int64_t>(ctx, c.ctx);
  if (fallback > 0) return std::min<int64_t>(ctx, fallback);
  return ctx;
}

Status configure_numa(const Config& c) {
  cpu::NumaOptions o = c.numa;
  if (o.topology.empty())
    if (const char* env = std::getenv("STRATA_TOPOLOGY"); env != nullptr) o.topology = env;
  if (auto r = cpu::set_numa(o); !r) return Error{"config " + c.source + ": numa: " + r.error().message};
  return {};
}

Result<Loaded> load_model(const CommonOptions& o, const char* cmd) {
  auto config = resolve_config(o);
  if (!config) return config.error();
  const Config& c = *config;
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
  auto m = Model::load(c.model_path, budget->load, c.repack, stream);
  if (!m) return m.error();
  std::string how = (*m)->file().load_mode() == MappedFile::Mode::ram ? "read into RAM" : "mapped";
  if (stream) {
    ExpertStoreOptions so;
    so.cache_bytes = budget->expert_cache_bytes;
    so.queue_depth = c.queue_depth;
    so.prefetch_depth = c.prefetch_depth;
    so.policy.kind = *parse_cache_policy(c.cache_policy);  // the config accepts only known names
    auto store = ExpertStore::open(**m, c.model_path, so);
    if (!store) return store.error();
    (*m)->expert_store = std::move(*store);
    const ExpertStore& st = *(*m)->expert_store;
    how = strfmt("%s resident, routed experts streamed: %" PRId64 " slots of %.1f MiB, %s",
                 format_bytes(double((*m)->resident_bytes)).c_str(), st.n_slots(), double(st.slot_bytes()) / 0x1p20,
                 std::string(st.read_method()).c_str());
  }
  // routed experts in VRAM: the GPU tier, on the simulated device or on a real GPU
  const bool has_experts = std::any_of((*m)->layers.begin(), (*m)->layers.end(),
                                       [](const LayerWeights& l) { return l.is_moe(); });
  const bool real_gpu = c.vram_budget > 0 && !c.gpu_simulate && n_gpus > 0;
  if (c.vram_budget > 0 && has_experts && (c.gpu_simulate || real_gpu)) {
    if (stream) return Error{"the GPU tier with routed experts streamed from NVMe (budgets.ram below the model) is not built"};
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
    auto tier = real_gpu ? GpuTier::create_cuda(**m, go) : GpuTier::create_simulated(**m, go);
    if (!tier) return Error{"config " + c.source + ": " + tier.error().message};
    (*m)->gpu_tier = std::move(*tier);
    if (!c.gpu_heat_file.empty()) {
      std::error_code ec;
      if (std::filesystem::exists(c.gpu_heat_file, ec)) {
        auto warm = (*m)->gpu_tier->load_heat(c.gpu_heat_file);
        if (!warm) return Error{"config " + c.source + ": " + warm.error().message};
        how += strfmt(", warm start: %d experts from %s", *warm, c.gpu_heat_file.c_str());
      }
      (*m)->gpu_tier->save_heat_at_exit(c.gpu_heat_file);
    }
    const GpuTier::Stats st = (*m)->gpu_tier->stats();
    how += strfmt(", %s: %" PRId64 " expert slots of %s for %" PRId64 " experts (%s)",
                  real_gpu ? "GPU tier on CUDA device 0" : "simulated GPU", st.slots, format_size(st.slot_bytes).c_str(),
                  st.n_experts, go.costs.describe().c_str());
  }
  if (real_gpu) {
    // the dense part's weights: the tier's fixed part of the budget (all of it without a tier)
    auto be = CudaBackend::create((*m)->gpu_tier ? GpuTier::fixed_bytes(**m) : c.vram_budget);
    if (!be) return Error{"config " + c.source + ": budgets.vram: " + be.error().message};
    (*m)->backend = std::move(*be);
    how += ", dense part on the CUDA backend (large batches: " + gpu::cuda_gemm_library() + ")";
  }
  {
    std::string skipped;
    const cpu::PlacementStats placed = place_in_numa(**m, cpu::numa_layout(), &skipped);
    if (cpu::numa_layout().topology().n_nodes() > 1 || cpu::numa_layout().n_groups() > 1)
      std::fprintf(stderr, "%s: %s; weights: %s\n", cmd, cpu::numa_layout().describe().c_str(),
                   skipped.empty() ? placed.describe(cpu::numa_layout()).c_str() : skipped.c_str());
  }
  if ((*m)->repacked_bytes > 0)
    how += strfmt(", %s repacked in %.2f s", format_bytes(double((*m)->repacked_bytes)).c_str(), (*m)->repack_seconds);
  std::fprintf(stderr, "%s: loaded %s (%s, %s) in %.2f s (%s), %d threads%s\n", cmd, c.model_path.c_str(),
               s->arch.c_str(), format_bytes(double(s->n_bytes)).c_str(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), how.c_str(),
               cpu::compute_pool().size(), c.source == "defaults" ? "" : (", config " + c.source).c_str());
  if (const int n = (*m)->hparams().n_nextn; n > 0) {
    if ((*m)->mtp != nullptr)
      std::fprintf(stderr, "%s: the file has %d multi-token-prediction (nextn) layer%s; the first drafts with "
                   "--draft mtp\n", cmd, n, n == 1 ? "" : "s");
    else
      std::fprintf(stderr, "%s: %s\n", cmd, (*m)->mtp_error.c_str());
  }
  return Loaded{std::move(*m), std::move(*s), std::move(*config)};
}

}  // namespace strata::cli
