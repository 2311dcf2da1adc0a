// strata replay: replays a routing trace through the VRAM / RAM expert caches
// (storage/expert_cache.h) and reports hits per tier, NVMe misses per token and Belady's optimum.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <memory>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"
#include "engine/planner.h"
#include "storage/expert_cache.h"
#include "storage/routing_trace.h"

namespace strata::cli {
namespace {

struct ReplayArgs {
  CommonOptions common;   // -c / --set / -m: budgets and a model turn slots into bytes and time
  std::string shape;      // or a synthetic shape for the model
  std::string quant = "q4_k";
  std::string trace_path;
  std::string synthetic;  // "LAYERSxEXPERTSxTOPK"
  SyntheticTraceParams synth;
  std::string order = "file";
  std::string policy;  // empty: storage.cache_policy of the config
  double half_life = CachePolicyOptions{}.half_life_tokens;
  std::optional<int64_t> vram_experts;  // unset: a quarter of all experts
  std::optional<int64_t> ram_experts;   // unset: a quarter of all experts
  bool all = false;
};

double pct(int64_t n, int64_t of) { return of ? 100.0 * double(n) / double(of) : 0.0; }

Result<RoutingTrace> load_trace(const ReplayArgs& a) {
  if (a.trace_path.empty() == a.synthetic.empty())
    return Error{"give one of --trace FILE or --synthetic LAYERSxEXPERTSxTOPK"};
  Result<RoutingTrace> trace = Error{};
  if (!a.trace_path.empty()) {
    trace = read_routing_trace(a.trace_path);
  } else {
    SyntheticTraceParams p = a.synth;
    int used = 0;
    if (std::sscanf(a.synthetic.c_str(), "%dx%dx%d%n", &p.n_layer, &p.n_expert, &p.top_k, &used) != 3 ||
        size_t(used) != a.synthetic.size())
      return Error{"--synthetic " + a.synthetic + ": expected LAYERSxEXPERTSxTOPK, e.g. 48x128x8"};
    trace = synthetic_routing_trace(p);
  }
  if (!trace) return trace;
  if (a.order == "token") return token_major_order(*trace);
  if (a.order != "file") return Error{"--order " + a.order + ": expected file or token"};
  return trace;
}

void print_trace(const RoutingTrace& t, const char* order) {
  std::printf("trace      %s\n", t.source.c_str());
  std::printf("           %zu steps (%.1f tokens), %d layers x %d experts, top-%d, %" PRId64
              " accesses, %s\n",
              t.steps.size(), t.n_tokens(), t.n_layer, t.n_expert, t.top_k, t.n_accesses(),
              order);
  // A decode loop changes layer at every step. A file that stays on one layer for long runs (the
  // Mixtral trace logs its decode tokens layer by layer) flatters policies whose slots are shared
  // across layers: they can hold the whole current layer.
  size_t same_layer = 0;
  for (size_t i = 1; i < t.steps.size(); ++i) same_layer += t.steps[i].layer == t.steps[i - 1].layer;
  if (t.n_layer > 1 && same_layer * 2 > t.steps.size())
    std::printf("note       %.0f%% of steps stay on the previous step's layer (layer-major): lru, "
                "lfu and Belady look better than in a decode loop; --order token replays token "
                "by token\n",
                100.0 * double(same_layer) / double(t.steps.size()));
}

// Hit rate (%) of every policy and Belady with one tier of C slots, C = per-layer eighths of the
// experts (1/8 .. 7/8).
void print_table(const RoutingTrace& t, double half_life) {
  std::printf("\nhit rate %% of one cache of C expert slots (with exclusive tiers: VRAM + RAM "
              "together, C = V + R)\n\n");
  std::printf("| slots C | per layer |");
  for (CachePolicyKind k : kAllCachePolicies) std::printf(" %s |", std::string(cache_policy_name(k)).c_str());
  std::printf(" belady |\n|---:|---:|");
  for (size_t i = 0; i < std::size(kAllCachePolicies); ++i) std::printf("---:|");
  std::printf("---:|\n");
  int64_t previous = -1;
  for (int eighth = 1; eighth <= 7; ++eighth) {
    const int64_t per_layer = std::max<int64_t>(1, std::llround(double(t.n_expert) * eighth / 8.0));
    const int64_t slots = per_layer * t.n_layer;
    if (slots == previous) continue;
    previous = slots;
    std::printf("| %" PRId64 " | %" PRId64 " of %d |", slots, per_layer, t.n_expert);
    for (CachePolicyKind k : kAllCachePolicies) {
      const ReplayResult r = replay_trace(t, {.kind = k, .half_life_tokens = half_life},
                                          {.vram_experts = slots, .ram_experts = 0});
      std::printf(" %.1f |", 100.0 * r.hit_rate());
    }
    std::printf(" %.1f |\n", pct(belady_hits(t, slots), t.n_accesses()));
  }
}

bool budget_mode(const ReplayArgs& a) {
  return !a.common.config_path.empty() || !a.common.sets.empty() || a.common.model || !a.shape.empty();
}

// The model the budgets are for: a GGUF header (-m) or a synthetic shape's.
Result<PlanModel> budget_model(const ReplayArgs& a, const Config& c) {
  if (!a.shape.empty()) return plan_model_for_shape(a.shape, a.quant, c.kv_type);
  auto f = GgufFile::open(c.model_path, MappedFile::Mode::mmap);
  if (!f) return f.error();
  return plan_model_from_gguf(*f, c.kv_type);
}

void print_split(const char* what, const Plan& p) {
  const StepTime& d = p.decode;
  auto share = [&](double t) { return d.total_s > 0 ? 100.0 * t / d.total_s : 0.0; };
  std::printf("%s %7.2f tok/s (%.1f ms per token: CPU %.0f%% | GPU %.0f%% | PCIe %.0f%% | NVMe %.0f%%); expert "
              "uses VRAM %.1f%% | RAM %.1f%% | NVMe %.1f%%\n",
              what, d.tok_per_s, 1e3 * d.total_s, share(d.cpu_s), share(d.gpu_s), share(d.pcie_s), share(d.nvme_s),
              100 * p.hit_vram, 100 * p.hit_ram, 100 * p.miss_nvme);
}

int run_replay(ReplayArgs a) {
  // budgets: the planner places the model, its tiers' shares of the experts become slots
  std::optional<Config> config;
  std::optional<PlanModel> model;
  std::optional<Plan> uniform;
  HardwareLimits limits;
  PlanOptions plan_options;
  if (budget_mode(a)) {
    auto c = resolve_config(a.common);
    if (!c) {
      std::fprintf(stderr, "strata replay: %s\n", c.error().message.c_str());
      return 1;
    }
    config = *c;
    auto m = budget_model(a, *config);
    if (!m) {
      std::fprintf(stderr, "strata replay: %s\n", m.error().message.c_str());
      return 1;
    }
    model = *m;
    auto resolved = resolve_limits(*config);
    if (!resolved) {
      std::fprintf(stderr, "strata replay: %s\n", resolved.error().message.c_str());
      return 1;
    }
    limits = resolved->limits;
    plan_options.ctx = config->ctx > 0 ? config->ctx : 4096;
    auto p = make_plan(*model, *config, limits, plan_options);
    if (!p) {
      std::fprintf(stderr, "strata replay: %s\n", p.error().message.c_str());
      return 1;
    }
    uniform = *p;
    if (a.policy.empty()) a.policy = config->cache_policy;
  }
  if (a.policy.empty()) a.policy = std::string(cache_policy_name(CachePolicyOptions{}.kind));
  auto policy = parse_cache_policy(a.policy);
  if (!policy) {
    std::fprintf(stderr, "strata replay: --policy %s: expected lru, lfu or layer-lru\n", a.policy.c_str());
    return 1;
  }
  if (a.vram_experts.value_or(0) < 0 || a.ram_experts.value_or(0) < 0) {
    std::fprintf(stderr, "strata replay: --vram-experts and --ram-experts must be >= 0\n");
    return 1;
  }
  if (!(a.half_life > 0)) {
    std::fprintf(stderr, "strata replay: --half-life %g: must be > 0 (inf: no decay)\n", a.half_life);
    return 1;
  }
  auto trace = load_trace(a);
  if (!trace) {
    std::fprintf(stderr, "strata replay: %s\n", trace.error().message.c_str());
    return 1;
  }
  const RoutingTrace& t = *trace;
  print_trace(t, !a.synthetic.empty() ? "token-major (as generated)"
                 : a.order == "token"    ? "token-major order"
                                         : "file order");
  if (a.all) {
    print_table(t, a.half_life);
    return 0;
  }

  const int64_t n_keys = int64_t(t.n_layer) * t.n_expert;
  TierCapacity cap{.vram_experts = a.vram_experts.value_or(n_keys / 4), .ram_experts = a.ram_experts.value_or(n_keys / 4)};
  if (uniform) {
    // the same share of the trace's experts as the plan gives each tier of the model's
    const Placement& p = uniform->placement;
    const double total = double(std::max<int64_t>(p.experts_total, 1));
    cap.vram_experts = a.vram_experts.value_or(std::llround(double(p.experts_in_vram) / total * double(n_keys)));
    cap.ram_experts = a.ram_experts.value_or(std::llround(double(p.experts_in_ram) / total * double(n_keys)));
    std::printf("budgets    %s: the plan holds %lld of %lld experts in VRAM and %lld in RAM; as slots of this trace: "
                "VRAM %lld, RAM %lld%s\n",
                config->source.c_str(), static_cast<long long>(p.experts_in_vram), static_cast<long long>(p.experts_total),
                static_cast<long long>(p.experts_in_ram), static_cast<long long>(cap.vram_experts),
                static_cast<long long>(cap.ram_experts),
                model->n_expert != t.n_expert || int(model->layers.size()) != t.n_layer
                    ? " (the model's layers x experts differ from the trace's: shares scaled)"
                    : "");
  }
  const CachePolicyOptions options{.kind = *policy, .half_life_tokens = a.half_life};
  const ReplayResult r = replay_trace(t, options, cap);
  const int64_t n = r.total.accesses;
  std::printf("policy     %s", a.policy.c_str());
  if (*policy == CachePolicyKind::lfu_decay) std::printf(" (half-life %g tokens)", a.half_life);
  std::printf("; exclusive tiers: VRAM %" PRId64 " experts (%.1f per layer), RAM %" PRId64
              " (%.1f per layer), NVMe the rest (%" PRId64 " experts in all)\n",
              cap.vram_experts, double(cap.vram_experts) / t.n_layer, cap.ram_experts,
              double(cap.ram_experts) / t.n_layer, n_keys);
  std::printf("accesses   %" PRId64 "\n", n);
  std::printf("VRAM       %9" PRId64 " hits    %5.1f%%   Belady %5.1f%% with %" PRId64 " slots\n",
              r.total.vram_hits, 100.0 * r.vram_hit_rate(), pct(belady_hits(t, cap.vram_experts), n),
              cap.vram_experts);
  std::printf("RAM        %9" PRId64 " hits    %5.1f%%\n", r.total.ram_hits, 100.0 * r.ram_hit_rate());
  std::printf("VRAM+RAM   %9" PRId64 " hits    %5.1f%%   Belady %5.1f%% with %" PRId64 " slots\n",
              r.total.vram_hits + r.total.ram_hits, 100.0 * r.hit_rate(),
              pct(belady_hits(t, cap.vram_experts + cap.ram_experts), n),
              cap.vram_experts + cap.ram_experts);
  std::printf("NVMe       %9" PRId64 " misses  %5.1f%%   %.2f per token\n", r.total.misses,
              100.0 * r.miss_rate(), r.misses_per_token());
  if (uniform) {
    // the predicted decode time with the measured hit rates instead of uniform routing
    PlanOptions measured = plan_options;
    measured.hit_vram = r.vram_hit_rate();
    measured.hit_ram = r.ram_hit_rate();
    auto p = make_plan(*model, *config, limits, measured);
    if (!p) {
      std::fprintf(stderr, "strata replay: %s\n", p.error().message.c_str());
      return 1;
    }
    std::printf("\npredicted decode of %s under %s:\n", model->name.empty() ? model->arch.c_str() : model->name.c_str(),
                config->source.c_str());
    print_split("  uniform routing   ", *uniform);
    print_split("  this trace's hits ", *p);
  }
  return 0;
}

}  // namespace

Runner add_replay_command(CLI::App& app) {
  auto args = std::make_shared<ReplayArgs>();
  CLI::App* sub = app.add_subcommand(
      "replay", "replay a routing trace through the VRAM / RAM expert caches (hits, NVMe misses)");
  add_common(sub, args->common);
  sub->add_option("--shape", args->shape, "with -c: the budgets are for this synthetic shape (else -m's model)");
  sub->add_option("--quant", args->quant, "quant mix of --shape: q8_0, q4_k, mxfp4");
  sub->add_option("--trace", args->trace_path, "routing trace, JSONL (../shared/traces/README.md)");
  sub->add_option("--synthetic", args->synthetic,
                  "a synthetic skewed trace instead, LAYERSxEXPERTSxTOPK (qwen3-30b-a3b: 48x128x8)");
  sub->add_option("--tokens", args->synth.n_tokens, "synthetic: tokens")->capture_default_str();
  sub->add_option("--zipf", args->synth.zipf_s, "synthetic: popularity of rank r ~ 1/r^S per layer")
      ->capture_default_str();
  sub->add_option("--repeat", args->synth.repeat,
                  "synthetic: chance that a pick repeats one of the previous token's experts")
      ->capture_default_str();
  sub->add_option("--drift", args->synth.drift,
                  "synthetic: fraction of a layer's experts that change popularity rank per token")
      ->capture_default_str();
  sub->add_option("--seed", args->synth.seed, "synthetic: seed")->capture_default_str();
  sub->add_option("--order", args->order,
                  "file: the trace's order; token: token-major (each token through every layer)")
      ->capture_default_str();
  sub->add_option("--policy", args->policy, "lru, lfu or layer-lru (default: storage.cache_policy, lfu)");
  sub->add_option("--half-life", args->half_life, "lfu: half-life in tokens (inf: no decay)")
      ->capture_default_str();
  sub->add_option("--vram-experts", args->vram_experts,
                  "VRAM expert slots, whole model (default: a quarter of all experts)");
  sub->add_option("--ram-experts", args->ram_experts,
                  "RAM expert slots, whole model (default: a quarter of all experts)");
  sub->add_flag("--all", args->all,
                "table of every policy and Belady for 1/8 .. 7/8 of each layer's experts");
  return [args] { return run_replay(*args); };
}

}  // namespace strata::cli
