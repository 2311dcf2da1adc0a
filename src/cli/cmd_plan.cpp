// strata plan: what lives in VRAM, RAM and on NVMe for a model under a config, and the predicted
// prefill and decode speed with its split, without loading a weight. The model is a GGUF file
// (-m; only its header is read) or a synthetic shape (--shape) for a model the user does not have.

#include <nlohmann/json.hpp>

#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "engine/planner.h"

namespace strata::cli {
namespace {

struct PlanCliOptions {
  CommonOptions common;
  std::string shape;
  std::string quant = "q4_k";
  int n_prompt = 512;
  bool json = false;
  bool seed_boxes = false;
};

// The boxes DeepSeek-V4.1-Flash users report figures from (issue #32): a preset of configs/ with
// what differs, and the decode speed reported on it.
struct SeedBox {
  const char* label;
  const char* preset;
  std::vector<std::string> sets;
  double reported_tok_s;
  const char* reported_how;
};
const std::vector<SeedBox>& seed_boxes() {
  static const std::vector<SeedBox> boxes = {
      {"RTX 3090 + 503 GiB DDR4 server", "rtx3090.toml",
       {"budgets.ram=480GiB", "hardware.ram=503GiB", "hardware.dram_gbps=150", "hardware.weights_gbps=130"}, 19.3,
       "CPU expert tier + elastic VRAM cache"},
      {"RTX 5090 + 126 GiB", "rtx5090.toml", {"budgets.ram=112GiB", "hardware.ram=126GiB"}, 5.1, "NVMe-bound"},
      {"RTX 5060 8 GB + 16 GB RAM cache", "rtx5060.toml", {"budgets.ram=16GiB"}, 2.4, "RAM cache of 16 GB"},
  };
  return boxes;
}

int fail(const std::string& m) {
  std::fprintf(stderr, "strata plan: %s\n", m.c_str());
  return 1;
}

std::string pct(double part, double whole) { return strfmt("%.0f%%", whole > 0 ? 100.0 * part / whole : 0.0); }

// The split of a step's time: each resource's busy time as a share of the step (they can overlap,
// so the shares can add up to more than 100%).
std::string split(const StepTime& t) {
  return "CPU " + pct(t.cpu_s, t.total_s) + " | GPU " + pct(t.gpu_s, t.total_s) + " | PCIe " + pct(t.pcie_s, t.total_s) +
         " | NVMe " + pct(t.nvme_s, t.total_s);
}

int run_plan(const PlanCliOptions& o);

// --seed-boxes: the plan of the model on each seed box, its predicted speed beside the figure users
// report there.
int run_seed_boxes(const PlanCliOptions& o) {
  std::printf("predictions (strata plan) for %s on the boxes users report from (issue #32); reported figures are "
              "theirs, not measured here\n\n",
              o.shape.empty() ? "-m MODEL" : ("shape " + o.shape + " at " + o.quant).c_str());
  std::printf("| box | Engram tables | routed-expert uses VRAM / RAM / NVMe | predicted decode | predicted prefill %d | reported decode |\n",
              o.n_prompt);
  std::printf("|---|---|---|---:|---:|---:|\n");
  for (const SeedBox& b : seed_boxes()) {
    CommonOptions co = o.common;
    co.config_path = std::string(STRATA_CONFIG_DIR) + "/" + b.preset;
    co.sets.insert(co.sets.begin(), b.sets.begin(), b.sets.end());
    auto c = resolve_config(co);
    if (!c) return fail(c.error().message);
    auto pm = !o.shape.empty() ? plan_model_for_shape(o.shape, o.quant, c->kv_type) : [&]() -> Result<PlanModel> {
      auto file = GgufFile::open(c->model_path, MappedFile::Mode::mmap);
      if (!file) return file.error();
      return plan_model_from_gguf(*file, c->kv_type);
    }();
    if (!pm) return fail(pm.error().message);
    auto resolved = resolve_limits(*c);
    if (!resolved) return fail(resolved.error().message);
    PlanOptions po;
    po.ctx = c->ctx > 0 ? c->ctx : 4096;
    po.prompt_tokens = o.n_prompt;
    auto plan = make_plan(*pm, *c, resolved->limits, po);
    if (!plan) return fail(std::string(b.label) + ": " + plan.error().message);
    const Placement& p = plan->placement;
    const std::string engram = pm->engram_bytes == 0 ? "none"
                               : p.ram_engram > 0   ? "in RAM (" + format_size(p.ram_engram) + ")"
                                                    : "on NVMe, row cache " + format_size(p.engram_cache) +
                                                          strfmt(" (%.1f%% of rows in RAM)", 100 * plan->engram_hit);
    std::printf("| %s (`-c configs/%s", b.label, b.preset);
    for (const std::string& s : b.sets) std::printf(" --set %s", s.c_str());
    std::printf("`) | %s | %.0f%% / %.0f%% / %.0f%% | %.1f tok/s | %.0f tok/s | %.1f tok/s (%s) |\n", engram.c_str(),
                100 * plan->hit_vram, 100 * plan->hit_ram, 100 * plan->miss_nvme, plan->decode.tok_per_s,
                plan->prefill.tok_per_s, b.reported_tok_s, b.reported_how);
  }
  return 0;
}

int run_plan(const PlanCliOptions& o) {
  if (o.seed_boxes) return run_seed_boxes(o);
  auto config = resolve_config(o.common);
  if (!config) return fail(config.error().message);
  Config& c = *config;

  // the model's inventory, from a header only
  Result<PlanModel> pm = Error{""};
  std::string model_label;
  if (!o.shape.empty()) {
    pm = plan_model_for_shape(o.shape, o.quant, c.kv_type);
    model_label = "shape " + o.shape + " at " + o.quant + " (no file)";
  } else {
    auto file = GgufFile::open(c.model_path, MappedFile::Mode::mmap);
    if (!file) return fail(file.error().message);
    pm = plan_model_from_gguf(*file, c.kv_type);
    model_label = c.model_path;
  }
  if (!pm) return fail(pm.error().message);

  // the machine: the config's [hardware], the rest from this machine's calibration cache
  auto resolved = resolve_limits(c);
  if (!resolved) return fail(resolved.error().message);
  const HardwareLimits& hw = resolved->limits;
  const std::string& hw_source = resolved->source;

  PlanOptions po;
  po.ctx = c.ctx > 0 ? c.ctx : 4096;
  po.prompt_tokens = o.n_prompt;
  auto plan = make_plan(*pm, c, hw, po);
  if (!plan) return fail(plan.error().message);
  const Placement& p = plan->placement;

  if (o.json) {
    nlohmann::json j;
    j["model"] = {{"name", model_label}, {"arch", pm->arch}, {"bytes", pm->total_bytes()},
                  {"routed_expert_bytes", pm->expert_bytes_total()}, {"layers", pm->layers.size()}};
    j["placement"] = {{"gpu_layers", p.gpu_layers}, {"output_on_gpu", p.output_on_gpu},
                      {"vram", {{"fixed", p.vram_fixed}, {"kv", p.vram_kv}, {"scratch", p.vram_scratch}, {"experts", p.vram_experts}, {"n_experts", p.experts_in_vram}}},
                      {"ram", {{"fixed", p.ram_fixed}, {"kv", p.ram_kv}, {"experts", p.ram_experts}, {"n_experts", p.experts_in_ram}}},
                      {"nvme", {{"experts", p.nvme_experts}, {"n_experts", p.experts_on_nvme}}}};
    j["hits"] = {{"vram", plan->hit_vram}, {"ram", plan->hit_ram}, {"nvme", plan->miss_nvme}};
    auto step = [](const StepTime& t) {
      return nlohmann::json{{"tok_per_s", t.tok_per_s}, {"seconds", t.total_s}, {"cpu_s", t.cpu_s}, {"gpu_s", t.gpu_s},
                            {"pcie_s", t.pcie_s}, {"nvme_s", t.nvme_s}, {"ram_bytes", t.ram_bytes},
                            {"vram_bytes", t.vram_bytes}, {"pcie_bytes", t.pcie_bytes}, {"nvme_bytes", t.nvme_bytes}};
    };
    j["decode"] = step(plan->decode);
    j["prefill"] = step(plan->prefill);
    j["prefill"]["tokens"] = o.n_prompt;
    j["notes"] = plan->notes;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }

  std::printf("model    %s: %s, %zu layers, %s of routed experts (%lld experts, %d of %d used per layer)\n",
              model_label.c_str(), format_size(pm->total_bytes()).c_str(), pm->layers.size(),
              format_size(pm->expert_bytes_total()).c_str(), static_cast<long long>(p.experts_total), pm->n_expert_used,
              pm->n_expert);
  std::printf("machine  %s%s; budgets: VRAM %s, RAM %s; limits from %s\n", hw.cpu_name.empty() ? "this CPU" : hw.cpu_name.c_str(),
              hw.gpu_name.empty() ? "" : (" + " + hw.gpu_name).c_str(), format_size(c.vram_budget).c_str(),
              c.ram_budget ? format_size(*c.ram_budget).c_str() : "auto", hw_source.c_str());
  std::printf("         RAM %.1f GB/s (decode kernels %.1f) | NVMe %.1f GB/s | PCIe %.1f GB/s | CPU int8 %.0f GOP/s",
              hw.dram_gbps, hw.weights_gbps, hw.nvme_gbps, hw.pcie_h2d_gbps, hw.cpu_int8_gops);
  if (c.vram_budget > 0) std::printf(" | GPU %.0f GB/s, %.0f TFLOP/s", hw.gpu_gbps, hw.gpu_tflops);
  std::printf("\n\nplacement (context %lld tokens):\n", static_cast<long long>(po.ctx));
  if (c.vram_budget > 0) {
    std::printf("  VRAM  %10s: attention/dense weights of %d/%zu layers + output head %s (%s), KV cache %s, scratch %s, "
                "%lld experts (%s)\n",
                format_size(p.vram_fixed + p.vram_kv + p.vram_scratch + p.vram_experts).c_str(), p.gpu_layers,
                pm->layers.size(), p.output_on_gpu ? "yes" : "no", format_size(p.vram_fixed).c_str(),
                format_size(p.vram_kv).c_str(), format_size(p.vram_scratch).c_str(),
                static_cast<long long>(p.experts_in_vram), format_size(p.vram_experts).c_str());
  }
  std::printf("  RAM   %10s: embeddings and CPU-side weights %s, KV cache %s, %lld experts (%s)\n",
              format_size(p.ram_fixed + p.ram_kv + p.ram_experts).c_str(), format_size(p.ram_fixed).c_str(),
              format_size(p.ram_kv).c_str(), static_cast<long long>(p.experts_in_ram), format_size(p.ram_experts).c_str());
  std::printf("  NVMe  %10s: %lld experts streamed when routed to\n", format_size(p.nvme_experts).c_str(),
              static_cast<long long>(p.experts_on_nvme));
  if (pm->engram_bytes > 0)
    std::printf("  Engram tables %s (%llu rows of %s per token): %s\n", format_size(pm->engram_bytes).c_str(),
                static_cast<unsigned long long>(pm->engram_rows_per_token), format_size(pm->engram_row_bytes).c_str(),
                p.ram_engram > 0 ? "in RAM"
                                 : ("on NVMe, read row by row into a RAM row cache of " + format_size(p.engram_cache) +
                                    strfmt(" (%.1f%% of the rows)", 100 * plan->engram_hit)).c_str());
  std::printf("  routed-expert uses served by: VRAM %.0f%% | RAM %.0f%% | NVMe %.0f%%\n", 100 * plan->hit_vram,
              100 * plan->hit_ram, 100 * plan->miss_nvme);
  const StepTime& d = plan->decode;
  const StepTime& pf = plan->prefill;
  std::printf("\npredicted decode   %8.2f tok/s  (%.1f ms per token: %s)\n", d.tok_per_s, d.total_s * 1e3, split(d).c_str());
  std::printf("   per token: RAM -> CPU %s, VRAM -> GPU %s, PCIe %s, NVMe %s\n", format_bytes(double(d.ram_bytes)).c_str(),
              format_bytes(double(d.vram_bytes)).c_str(), format_bytes(double(d.pcie_bytes)).c_str(),
              format_bytes(double(d.nvme_bytes)).c_str());
  std::printf("predicted prefill  %8.1f tok/s  (%d tokens in %.2f s: %s)\n", pf.tok_per_s, o.n_prompt, pf.total_s, split(pf).c_str());
  for (const std::string& n : plan->notes) std::printf("note: %s\n", n.c_str());
  return 0;
}

}  // namespace

Runner add_plan_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("plan", "place a model's weights in VRAM, RAM and NVMe and predict its speed (no weights read)");
  auto o = std::make_shared<PlanCliOptions>();
  add_common(sub, o->common);
  sub->add_option("--shape", o->shape, "plan for a model you do not have: a synthetic shape (strata synth --list)");
  sub->add_option("--quant", o->quant, "quant mix of --shape: q8_0, q4_k (Q4_K_M), mxfp4");
  sub->add_option("-p,--n-prompt", o->n_prompt, "prompt tokens of the prefill prediction")->check(CLI::PositiveNumber);
  sub->add_flag("--json", o->json, "print the plan as JSON");
  sub->add_flag("--seed-boxes", o->seed_boxes,
                "plan on each box DeepSeek-V4.1-Flash users report from (presets of configs/ and what differs) and "
                "print the predictions beside the reported figures");
  return [o] { return run_plan(*o); };
}

}  // namespace strata::cli
