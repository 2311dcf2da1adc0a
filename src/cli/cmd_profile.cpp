// strata profile: run a standard prompt and decode, and say where each decoded token's time went:
// by hardware link (CPU, GPU, PCIe, NVMe, idle), by part of the layer, by layer; bytes per token
// and the bandwidth they were read at against the machine's calibrated limit. Writes a Chrome /
// Perfetto trace and an SVG chart; --json prints the figures for machines.

#include <nlohmann/json.hpp>

#include <chrono>
#include <cinttypes>
#include <optional>
#include <cstdio>
#include <fstream>
#include <memory>

#include <sys/resource.h>

#include "base/profiler.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cpu/calibrate.h"
#include "cpu/kernel_probe.h"
#include "cpu/kernels.h"
#include "cpu/thread_pool.h"
#include "engine/gpu_tier.h"
#include "engine/planner.h"
#include "engine/profile_report.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "model/tokenizer.h"
#include "storage/disk_probe.h"
#include "storage/row_store.h"

namespace strata::cli {
namespace {

struct ProfileOptions {
  CommonOptions common;
  int n_prompt = 128;
  int n_gen = 32;
  std::string trace_path = "strata-profile.trace.json";
  std::string svg_path = "strata-profile.svg";
  bool json = false;
};

// The standard prompt: plain English, repeated to the length asked for.
constexpr const char* kStandardText =
    "The history of computing is a story of memory. Every generation of machines was limited less by "
    "how fast it could calculate than by how fast it could move numbers from where they were stored "
    "to where they were needed. Engineers learned to keep the data that is used most often close to "
    "the processor, and to stream the rest in large, regular blocks. ";

int fail(const std::string& m) {
  std::fprintf(stderr, "strata profile: %s\n", m.c_str());
  return 1;
}

Status write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return Error{"cannot write " + path};
  out << text;
  if (!out) return Error{"write to " + path + " failed"};
  return {};
}

int run_profile(const ProfileOptions& o) {
  auto loaded = load_model(o.common, "strata profile");
  if (!loaded) return fail(loaded.error().message);
  const Engine& engine = **loaded;
  const Model& m = engine.model();
  const ModelSummary& sm = engine.summary();
  const Config& config = engine.config();
  auto tok = Tokenizer::from_gguf(m.file());
  if (!tok) return fail(tok.error().message);

  // the machine's limits: the config's, else the calibration cache, else measured now
  auto resolved = resolve_limits(config);
  if (!resolved) return fail(resolved.error().message);
  HardwareLimits limits = resolved->limits;
  std::string limits_source = resolved->source;
  cpu::ThreadPool& pool = cpu::compute_pool();
  if (limits.dram_gbps <= 0) {
    limits.dram_gbps = cpu::measure_read_gbps(pool);
    limits_source = "measured now (run strata calibrate to cache it)";
  }

  // the disk's rate for the NVMe tier's reads (random 1 MiB reads of the model file at the tier's
  // queue depth, as strata bench probes it), before the run: its reads would share the disk
  if (engine.expert_store() != nullptr) {
    storage::DiskProbeOptions po;
    po.path = config.model_path;
    po.queue_depth = config.queue_depth;
    po.access = storage::DiskAccess::random;
    po.seconds = 2;
    if (auto probe = storage::measure_disk_read(po)) limits.nvme_gbps = probe->gbps;
  }
  std::vector<TokenId> prompt;
  while (int(prompt.size()) < o.n_prompt) {
    auto ids = tok->tokenize(kStandardText, prompt.empty(), false);
    prompt.insert(prompt.end(), ids.begin(), ids.end());
  }
  prompt.resize(size_t(o.n_prompt));
  const int64_t need = o.n_prompt + o.n_gen;
  if (need > context_limit(m, config)) {
    return fail(strfmt("%d + %d tokens exceed the context of %lld", o.n_prompt, o.n_gen,
                       static_cast<long long>(context_limit(m, config))));
  }
  Session session(engine, int(need), cpu::MatmulPath::quantized, config.kv_type);
  Sampler sampler(SamplerParams{.temperature = 0.0f});

  prof::reset();
  prof::enable(true);
  const int64_t t_prefill = prof::now_ns();
  auto l = session.eval(prompt);
  if (!l) return fail(l.error().message);
  const double prefill_s = double(prof::now_ns() - t_prefill) / 1e9;
  std::vector<TokenId> history(prompt.begin(), prompt.end());
  TokenId next = sampler.sample(*l, history);

  // decode: only these steps are in the split
  prof::reset();
  prof::take_events();
  prof::enable_tracing(!o.trace_path.empty());
  const Engine::TierStats tiers0 = engine.tier_stats();
  if (engine.engram_store() != nullptr) engine.engram_store()->reset_stats();
  rusage ru0{}, ru1{};
  getrusage(RUSAGE_SELF, &ru0);
  std::vector<TokenMark> marks;
  int64_t wall_ns = 0;
  for (int i = 0; i < o.n_gen; ++i) {
    const int64_t t0 = prof::now_ns();
    history.push_back(next);
    auto logits = session.eval(std::span<const TokenId>(&next, 1));
    if (!logits) return fail(logits.error().message);
    next = sampler.sample(*logits, history);
    const int64_t dt = prof::now_ns() - t0;
    wall_ns += dt;
    marks.push_back({t0, dt, i});
  }
  prof::enable_tracing(false);
  prof::enable(false);
  const Engine::TierStats tiers1 = engine.tier_stats();
  getrusage(RUSAGE_SELF, &ru1);
  const ProfileSnapshot snap = take_snapshot(m.hparams().n_layer);
  const std::vector<prof::Event> events = prof::take_events();

  const int n = std::max(o.n_gen, 1);
  const double wall_s = double(wall_ns) / 1e9;
  const double ms_per_token = double(wall_ns) / 1e6 / n;
  // the links, ms per token. CPU: the process's CPU time over the decode (every thread: compute,
  // the reader, the kernel's time in its system calls) per compute thread, as the operating system
  // counts it (a span also holds time a thread is blocked: on another thread's read, at a barrier);
  // NVMe wait: the compute threads' waits on reads (summed over the threads, so divided by them);
  // the rest of the wall time: blocked on something else, or idle. GPU and PCIe: the tier's
  // modelled timeline; NVMe: time with a read in flight
  auto link_ms = [&](prof::Link k) { return double(snap.link_ns[size_t(k)]) / 1e6 / n; };
  auto tv_ms = [](const timeval& a, const timeval& b) {
    return double(b.tv_sec - a.tv_sec) * 1e3 + double(b.tv_usec - a.tv_usec) / 1e3;
  };
  const double threads = std::max(pool.size(), 1);
  const double os_user_ms = tv_ms(ru0.ru_utime, ru1.ru_utime) / n / threads;
  const double os_sys_ms = tv_ms(ru0.ru_stime, ru1.ru_stime) / n / threads;
  const double spans_ms = double(snap.spans_ns()) / 1e6 / n;
  // deepseek41's Engram rows: the forward pass's own thread waits for them (recorded once, not per
  // compute thread); the experts' waits are the rest of the link's
  const RowStoreStats engram = engine.engram_store() != nullptr ? engine.engram_store()->stats() : RowStoreStats{};
  const double engram_wait_ms = 1e3 * engram.wait_seconds / n;
  const double expert_wait_ms = std::max(0.0, link_ms(prof::Link::nvme_wait) - engram_wait_ms) / threads;
  const double wait_ms = std::min(expert_wait_ms + engram_wait_ms, ms_per_token);
  const double cpu_ms = std::min(os_user_ms + os_sys_ms, ms_per_token - wait_ms);
  const double gpu_ms = link_ms(prof::Link::gpu);
  const double pcie_ms = link_ms(prof::Link::pcie_h2d) + link_ms(prof::Link::pcie_d2h);
  const double nvme_ms = link_ms(prof::Link::nvme_read);
  const double idle_ms = std::max(0.0, ms_per_token - cpu_ms - wait_ms);
  auto share = [&](double ms) { return ms_per_token > 0 ? ms / ms_per_token : 0.0; };
  const double spans_share = share(spans_ms);

  // the tiers over the decode: uses served by each, bytes per link
  const double uses = double(tiers1.uses - tiers0.uses);
  const bool tiered = engine.expert_store() != nullptr || engine.gpu_tier() != nullptr;
  const double hit_vram = uses > 0 ? double(tiers1.vram - tiers0.vram) / uses : 0.0;
  const double hit_nvme = uses > 0 ? double(tiers1.nvme - tiers0.nvme) / uses : 0.0;
  const double hit_ram = tiered && uses > 0 ? double(tiers1.ram - tiers0.ram) / uses : 1.0;
  const double pcie_bytes = double(tiers1.pcie_bytes - tiers0.pcie_bytes) / n;
  const double nvme_bytes = double(tiers1.nvme_bytes - tiers0.nvme_bytes) / n;
  // bytes the CPU reads per decoded token: the active weights less the VRAM's share of the routed
  // experts', and the KV cache of the positions attended to (on average the middle of the decode)
  const double kv_bytes = double(kv_bytes_per_token(m.hparams(), session.kv_type())) * (o.n_prompt + o.n_gen / 2.0);
  const double routed = sm.n_expert > 0 ? double(sm.expert_bytes_total) * double(sm.n_expert_used) / double(sm.n_expert) : 0.0;
  const double weight_bytes = double(sm.active_bytes_per_token) - routed * hit_vram;
  const double cpu_gbps = cpu_ms > 0 ? (weight_bytes + kv_bytes) / (cpu_ms / 1e3) / 1e9 : 0.0;
  const double pcie_gbps = pcie_ms > 0 ? pcie_bytes / (pcie_ms / 1e3) / 1e9 : 0.0;
  const double nvme_gbps = nvme_ms > 0 ? nvme_bytes / (nvme_ms / 1e3) / 1e9 : 0.0;
  const bool in_ram = m.file().load_mode() == MappedFile::Mode::ram;

  // the planner's prediction for the same config, with the hit rates just measured (the cost
  // model is checked, not the cache policy); its limits: the config's or the calibration's, the
  // GPU tier's rates, and what is unknown measured now
  HardwareLimits plan_limits = limits;
  if (const GpuTier* g = engine.gpu_tier()) {
    if (plan_limits.gpu_gbps <= 0) plan_limits.gpu_gbps = g->costs().vram_gbps;
    if (plan_limits.gpu_tflops <= 0) plan_limits.gpu_tflops = g->costs().gpu_ops / 1e12;
    if (plan_limits.pcie_h2d_gbps <= 0) plan_limits.pcie_h2d_gbps = g->costs().pcie_gbps;
  }
  if (plan_limits.cpu_int8_gops <= 0) plan_limits.cpu_int8_gops = cpu::measure_int8_peak_gops(pool);
  if (plan_limits.repack_gbps <= 0 && config.repack && engine.expert_store() != nullptr)
    plan_limits.repack_gbps = cpu::measure_interleave_gbps(pool, size_t(256) << 20, 0.3);
  if (plan_limits.ram_bytes == 0) plan_limits.ram_bytes = system_memory().total;
  std::optional<Plan> plan;
  std::string plan_error;
  {
    auto pm = plan_model_from_gguf(m.file(), session.kv_type());
    PlanOptions po;
    po.ctx = need;
    po.prompt_tokens = o.n_prompt + o.n_gen / 2;
    if (tiered) {
      po.hit_vram = hit_vram;
      po.hit_ram = hit_ram;
    }
    if (engine.gpu_tier() != nullptr) po.promotions_per_token = double(tiers1.promotions - tiers0.promotions) / n;
    auto p = pm ? make_plan(*pm, config, plan_limits, po) : Result<Plan>(pm.error());
    if (p) plan = std::move(*p);
    else plan_error = p.error().message;
  }
  const double p_cpu = plan ? plan->decode.cpu_s * 1e3 : 0, p_gpu = plan ? plan->decode.gpu_s * 1e3 : 0,
               p_pcie = plan ? plan->decode.pcie_s * 1e3 : 0, p_nvme = plan ? plan->decode.nvme_s * 1e3 : 0,
               p_total = plan ? plan->decode.total_s * 1e3 : 0;

  if (!o.trace_path.empty()) {
    if (Status s = write_text(o.trace_path, chrome_trace_json(events, marks)); !s) return fail(s.error().message);
  }
  const std::string title = strfmt("%s (%s), %d threads, %s: decode after %d prompt tokens", sm.name.empty() ? sm.arch.c_str() : sm.name.c_str(),
                                   format_bytes(double(sm.n_bytes)).c_str(), pool.size(),
                                   std::string(cpu::isa_name()).c_str(), o.n_prompt);
  const LinkShares shares{.cpu = share(cpu_ms), .nvme_wait = share(wait_ms), .idle = share(idle_ms),
                          .gpu = share(gpu_ms), .pcie = share(pcie_ms), .nvme_read = share(nvme_ms)};
  if (!o.svg_path.empty()) {
    if (Status s = write_text(o.svg_path, layer_chart_svg(snap, n, title, &shares)); !s) return fail(s.error().message);
  }

  if (o.json) {
    nlohmann::json j;
    j["model"] = {{"path", config.model_path}, {"arch", sm.arch}, {"bytes", sm.n_bytes},
                  {"active_bytes_per_token", sm.active_bytes_per_token}, {"n_layer", m.hparams().n_layer}};
    j["machine"] = {{"threads", pool.size()}, {"isa", std::string(cpu::isa_name())},
                    {"dram_gbps", limits.dram_gbps}, {"limits_source", limits_source}};
    j["prefill"] = {{"tokens", o.n_prompt}, {"seconds", prefill_s}, {"tok_per_s", o.n_prompt / prefill_s}};
    j["decode"] = {{"tokens", o.n_gen}, {"seconds", wall_s}, {"ms_per_token", ms_per_token},
                   {"tok_per_s", wall_s > 0 ? o.n_gen / wall_s : 0.0}, {"spans_cover", spans_share}};
    j["split"] = {{"cpu", share(cpu_ms)}, {"gpu", share(gpu_ms)}, {"pcie", share(pcie_ms)}, {"nvme", share(nvme_ms)},
                  {"nvme_wait", share(wait_ms)}, {"idle", share(idle_ms)}};
    j["ms_per_token_by_link"] = {{"cpu", cpu_ms}, {"gpu", gpu_ms}, {"pcie", pcie_ms}, {"nvme", nvme_ms},
                                 {"nvme_wait", wait_ms}, {"idle", idle_ms}, {"os_user_per_thread", os_user_ms},
                                 {"os_system_per_thread", os_sys_ms}};
    if (plan)
      j["predicted_ms_per_token_by_link"] = {{"cpu", p_cpu}, {"gpu", p_gpu}, {"pcie", p_pcie}, {"nvme", p_nvme},
                                             {"total", p_total}};
    else
      j["predicted_ms_per_token_by_link"] = {{"error", plan_error}};
    nlohmann::json parts = nlohmann::json::object();
    for (size_t p = 0; p < size_t(prof::Part::count); ++p)
      parts[std::string(prof::kPartNames[p])] = double(snap.part_ns[p]) / 1e6 / n;
    j["ms_per_token_by_part"] = parts;
    j["hits"] = {{"vram", hit_vram}, {"ram", hit_ram}, {"nvme", hit_nvme}, {"promotions", tiers1.promotions - tiers0.promotions}};
    if (engine.engram_store() != nullptr)
      j["engram"] = {{"rows_per_token", double(engram.rows) / n}, {"distinct_rows_per_token", double(engram.lookups) / n},
                     {"hit_rate", engram.hit_rate()}, {"bytes_per_token", double(engram.bytes_read) / n},
                     {"reads_per_token", double(engram.reads) / n}, {"wait_ms_per_token", engram_wait_ms},
                     {"expert_wait_ms_per_token", expert_wait_ms}};
    j["bytes_per_token"] = {{"ram_to_cpu", weight_bytes + kv_bytes}, {"weights", weight_bytes}, {"kv_cache", kv_bytes},
                            {"pcie", pcie_bytes}, {"nvme", nvme_bytes}, {"ram_gbps_achieved", cpu_gbps},
                            {"ram_fraction_of_limit", limits.dram_gbps > 0 ? cpu_gbps / limits.dram_gbps : 0.0},
                            {"pcie_gbps_achieved", pcie_gbps}, {"nvme_gbps_achieved", nvme_gbps},
                            {"repack_gbps", plan_limits.repack_gbps}};
    nlohmann::json layers = nlohmann::json::array();
    for (size_t li = 0; li < snap.layer_ns.size(); ++li) {
      nlohmann::json row = nlohmann::json::object();
      for (size_t p = 0; p < size_t(prof::Part::count); ++p)
        if (snap.layer_ns[li][p] > 0) row[std::string(prof::kPartNames[p])] = double(snap.layer_ns[li][p]) / 1e6 / n;
      layers.push_back(row);
    }
    j["ms_per_token_by_layer"] = layers;
    j["files"] = {{"trace", o.trace_path}, {"chart", o.svg_path}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }

  std::printf("%s\n", title.c_str());
  std::printf("prefill  %d tokens in %.3f s = %.1f tok/s\n", o.n_prompt, prefill_s, o.n_prompt / prefill_s);
  std::printf("decode   %d tokens in %.3f s = %.2f tok/s, %.3f ms per token\n", o.n_gen, wall_s,
              wall_s > 0 ? o.n_gen / wall_s : 0.0, ms_per_token);
  // a share as a percentage; a link that was busy never shows as 0
  auto pct = [](double x) { return x > 0 && x < 0.001 ? std::string("<0.1%") : strfmt("%.1f%%", 100 * x); };
  std::printf("\nsplit of decode time: CPU %s | GPU %s | PCIe %s | NVMe %s | idle %s\n", pct(share(cpu_ms)).c_str(),
              pct(share(gpu_ms)).c_str(), pct(share(pcie_ms)).c_str(), pct(share(nvme_ms)).c_str(), pct(share(idle_ms)).c_str());
  std::printf("  the host: CPU compute %.1f%% (its threads' CPU time: user %.1f + system %.1f ms a token per thread) + waiting on\n"
              "  NVMe reads %.1f%% + blocked otherwise or idle %.1f%% = 100%%; the parts' spans cover %.1f%% of the wall time;\n"
              "  beside it, each link's busy share: GPU (the tier's device work), PCIe (its copies)%s, NVMe (a read in flight)\n",
              100 * share(cpu_ms), os_user_ms, os_sys_ms, 100 * share(wait_ms), 100 * share(idle_ms), 100 * spans_share,
              engine.gpu_tier() == nullptr ? "" : engine.gpu_tier()->on_cuda() ? ": modelled at the tier's rates, CUDA events are not read yet" : ": the simulated device's timeline");
  std::printf("\nper token, by link: measured | predicted (strata plan, this config, the hit and promotion rates measured here)\n");
  auto row = [&](const char* name, double got, double want) {
    if (plan) std::printf("  %-10s %9.3f ms | %9.3f ms  %s\n", name, got, want, got > 0 ? strfmt("(%.2fx)", want / got).c_str() : "");
    else std::printf("  %-10s %9.3f ms\n", name, got);
  };
  row("CPU", cpu_ms, p_cpu);
  row("GPU", gpu_ms, p_gpu);
  row("PCIe", pcie_ms, p_pcie);
  row("NVMe", nvme_ms, p_nvme);
  if (plan) std::printf("  %-10s %9.3f ms | %9.3f ms\n", "token", ms_per_token, p_total);
  else std::printf("  predicted: %s\n", plan_error.c_str());
  std::printf("\nper token, by part:\n");
  for (size_t p = 0; p < size_t(prof::Part::count); ++p) {
    if (snap.part_calls[p] == 0) continue;
    std::printf("  %-22s %9.3f ms %s\n", std::string(prof::kPartNames[p]).c_str(), double(snap.part_ns[p]) / 1e6 / n,
                prof::nested(prof::Part(p)) ? "(inside attention)" : "");
  }
  if (tiered)
    std::printf("\nexpert uses per tier: VRAM %.1f%% | RAM %.1f%% | NVMe %.1f%% (%.0f uses, %" PRIu64 " promotions into VRAM)\n",
                100 * hit_vram, 100 * hit_ram, 100 * hit_nvme, uses, tiers1.promotions - tiers0.promotions);
  else
    std::printf("\nexpert uses per tier: VRAM - | RAM 100%% | NVMe - (%s)\n",
                in_ram ? "all weights read into RAM" : "weights mapped: pages the kernel evicted come back from disk unseen");
  std::printf("\nbytes per token, by link:\n");
  std::printf("  RAM -> CPU  %s (weights %s + KV cache %s) at %.1f GB/s over CPU time = %.2f of DRAM %.1f GB/s (%s)\n",
              format_bytes(weight_bytes + kv_bytes).c_str(), format_bytes(weight_bytes).c_str(),
              format_bytes(kv_bytes).c_str(), cpu_gbps, limits.dram_gbps > 0 ? cpu_gbps / limits.dram_gbps : 0.0,
              limits.dram_gbps, limits_source.c_str());
  if (engine.gpu_tier() != nullptr)
    std::printf("  PCIe        %s at %.1f GB/s while copying (the tier's rate: %.1f GB/s)\n", format_bytes(pcie_bytes).c_str(),
                pcie_gbps, engine.gpu_tier()->costs().pcie_gbps);
  else
    std::printf("  PCIe        0 B (no GPU tier: budgets.vram = 0)\n");
  if (engine.expert_store() != nullptr) {
    std::printf("  NVMe        %s at %.2f GB/s while reading = %.2f of the disk's %.2f GB/s\n", format_bytes(nvme_bytes).c_str(),
                nvme_gbps, plan_limits.nvme_gbps > 0 ? nvme_gbps / plan_limits.nvme_gbps : 0.0, plan_limits.nvme_gbps);
    if (config.repack && plan_limits.repack_gbps > 0)
      std::printf("              interleaved by the CPU threads for the kernels: %.1f GB/s by the probe (hardware.repack_gbps), %.1f ms a token\n",
                  plan_limits.repack_gbps, nvme_bytes / (plan_limits.repack_gbps * 1e9) * 1e3);
  } else {
    std::printf("  NVMe        0 B (the routed experts are in RAM: budgets.ram holds the model)\n");
  }
  if (engine.engram_store() != nullptr)
    std::printf("  Engram      %.1f rows per token (%.1f distinct), row-cache hit rate %.3f, %s read per token in %.1f "
                "reads; waited %.2f ms per token (experts' reads: %.2f ms per compute thread)\n",
                double(engram.rows) / n, double(engram.lookups) / n, engram.hit_rate(),
                format_bytes(double(engram.bytes_read) / n).c_str(), double(engram.reads) / n, engram_wait_ms,
                expert_wait_ms);

  std::printf("\nper layer, ms per token (A attention, R router, E experts, S shared/dense ffn):\n");
  double max_ms = 0;
  for (size_t li = 0; li < snap.layer_ns.size(); ++li) max_ms = std::max(max_ms, double(snap.layer_total_ns(li)) / 1e6 / n);
  const struct {
    prof::Part part;
    char c;
  } bars[] = {{prof::Part::attention, 'A'}, {prof::Part::router, 'R'}, {prof::Part::experts, 'E'}, {prof::Part::shared_ffn, 'S'}};
  for (size_t li = 0; li < snap.layer_ns.size(); ++li) {
    const double total = double(snap.layer_total_ns(li)) / 1e6 / n;
    std::string bar;
    for (const auto& b : bars) {
      const double ms = double(snap.layer_ns[li][size_t(b.part)]) / 1e6 / n;
      bar.append(size_t(max_ms > 0 ? ms / max_ms * 60.0 + 0.5 : 0), b.c);
    }
    std::printf("  %3zu %8.3f %s\n", li, total, bar.c_str());
  }
  if (!o.trace_path.empty())
    std::printf("\ntrace: %s (%zu spans, a track per link; open in https://ui.perfetto.dev or chrome://tracing)\n",
                o.trace_path.c_str(), events.size());
  if (!o.svg_path.empty()) std::printf("chart: %s\n", o.svg_path.c_str());
  return 0;
}

}  // namespace

Runner add_profile_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("profile", "where each decoded token's time goes: CPU, GPU, PCIe, NVMe, by part and layer");
  auto o = std::make_shared<ProfileOptions>();
  add_common(sub, o->common);
  sub->add_option("-p,--n-prompt", o->n_prompt, "prompt tokens (the standard prompt, repeated)")->check(CLI::PositiveNumber);
  sub->add_option("-n,--n-gen", o->n_gen, "decoded tokens profiled")->check(CLI::PositiveNumber);
  sub->add_option("--trace", o->trace_path, "Chrome / Perfetto trace file (\"\": none)");
  sub->add_option("--svg", o->svg_path, "per-layer chart (\"\": none)");
  sub->add_flag("--json", o->json, "print the figures as JSON");
  return [o] { return run_profile(*o); };
}

}  // namespace strata::cli
