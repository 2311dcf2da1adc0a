#include "cli/bench_speculative.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "base/profiler.h"
#include "cpu/calibrate.h"
#include "cpu/thread_pool.h"
#include "engine/generate.h"
#include "engine/session.h"
#include "engine/speculative.h"

namespace strata::cli {
namespace {

// A part's bound: the larger of its read time (mem), its int8 work (cmp) and its disk reads (nvm).
struct Bound {
  double s = 0;
  const char* kind = "mem";
};
Bound larger(double mem_s, double cmp_s, double nvme_s = 0) {
  Bound b{mem_s, "mem"};
  if (cmp_s > b.s) b = {cmp_s, "cmp"};
  if (nvme_s > b.s) b = {nvme_s, "nvm"};
  return b;
}

struct KCost {
  int k = 0;
  double seconds = 0;       // mean step time
  double experts = 0;       // routed experts computed per step (all layers)
  double expert_bytes = 0;  // their weight bytes
  double nvme_bytes = 0;    // read from disk per step
  double dram_gbps = 0;     // probed around the steps
  double int8_gops = 0;
  double memory_s = 0, compute_s = 0, nvme_s = 0;  // the bounds: bytes / DRAM, ops / int8 peak, disk
  double roofline = 0;      // the largest of them, seconds
  // The routed experts and the rest run one after the other in each layer, so neither hides
  // behind the other: each part's bound is the larger of its reads and its int8 work (and NVMe
  // for the experts), and the step's per-part bound is their sum.
  Bound experts_bound, rest_bound;
  std::array<double, size_t(prof::Part::count)> part_s{};  // mean seconds per part of the step
};

}  // namespace

int bench_speculative(const Engine& engine, const SpeculativeBenchOptions& o) {
  const Model& m = engine.model();
  const ModelSummary& sm = engine.summary();
  const HParams& hp = m.hparams();
  ExpertStore* store = engine.expert_store();
  cpu::ThreadPool& pool = cpu::compute_pool();
  // each step keeps one token: (max_k + 1) k values of steps + 1 steps, the last one k + 1 wide
  const int64_t ctx = int64_t(o.depth) + int64_t(o.max_k + 1) * (o.steps + 1) + o.max_k + 1;
  const int64_t limit = context_limit(m, engine.config());
  if (ctx > limit) {
    std::fprintf(stderr, "strata bench: --speculative needs a context of %lld (depth %d, %d steps per k), more than %lld\n",
                 static_cast<long long>(ctx), o.depth, o.steps, static_cast<long long>(limit));
    return 1;
  }
  std::mt19937 rng(99);
  auto random_tokens = [&](int n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& id : t) id = int32_t(rng() % uint32_t(hp.n_vocab));
    return t;
  };
  Session s(engine, int(ctx), cpu::MatmulPath::quantized, engine.config().kv_type);
  if (o.depth > 0) {
    if (auto l = s.eval(random_tokens(o.depth)); !l) {
      std::fprintf(stderr, "strata bench: %s\n", l.error().message.c_str());
      return 1;
    }
  }
  // the routed bytes one token reads, and so the rest (dense, shared, attention, head)
  const double routed_per_token = sm.n_expert ? double(sm.expert_bytes_total) * double(sm.n_expert_used) / double(sm.n_expert) : 0;
  const double dense_bytes = double(sm.active_bytes_per_token) - routed_per_token;
  // and the same in weights (each a multiply-add per token)
  const double routed_params = double(sm.active_routed_params_per_token);
  const double dense_params = double(sm.active_params_per_token) - routed_params;
  // end to end: generation with adaptive k against plain decoding. Greedy: the n-gram drafter
  // (a random-weight model may fall into loops it predicts), and drafts that are the plain run's
  // own next tokens with probability a, else wrong (an acceptance rate set on purpose, which a
  // random-weight model cannot give a real drafter); at temperature 1, the n-gram drafter again
  // (drafts rarely accepted: the controller must turn drafting down).
  struct EndToEnd {
    std::string what;
    double tps = 0, vs_plain = 1;
    GenerateResult r;
  };
  std::vector<EndToEnd> e2e;
  if (o.gen_tokens > 0) {
    auto tok = Tokenizer::from_gguf(m.file());
    if (!tok) {
      std::fprintf(stderr, "strata bench: %s\n", tok.error().message.c_str());
      return 1;
    }
    const std::vector<int32_t> prompt = random_tokens(std::max(1, o.depth));
    std::vector<TokenId> reference;  // the greedy plain run's tokens, prompt included
    // mtp: draft with the model's MTP layer (made on the run's session) instead of d
    auto run = [&](const std::string& what, float temp, Drafter* d, int n, bool mtp = false) -> Status {
      Session gs(engine, int(prompt.size()) + n + 1, cpu::MatmulPath::quantized, engine.config().kv_type);
      std::unique_ptr<MtpDrafter> own;
      if (mtp) {
        auto made = MtpDrafter::create(gs);
        if (!made) return made.error();
        own = std::move(*made);
        d = own.get();
      }
      Sampler sampler({.temperature = temp, .top_k = 40, .top_p = 1.0f, .min_p = 0.0f, .seed = 5});
      std::vector<TokenId> history;
      GenerateOptions go{.n_predict = n, .ignore_eos = true, .drafter = d, .max_draft = o.max_k};
      auto r = generate(gs, *tok, sampler, prompt, history, go, [](std::string_view) {});
      if (!r) return r.error();
      if (what.empty()) return {};  // warm-up
      EndToEnd e{what, (r->n_generated - 1) / r->decode_seconds, 1, *r};
      if (d == nullptr && temp == 0) reference = history;
      for (const EndToEnd& p : e2e)  // against "<same sampling>, plain"
        if (p.what == what.substr(0, what.find(',')) + ", plain") e.vs_plain = e.tps / p.tps;
      e2e.push_back(e);
      return {};
    };
    // a drafter that proposes the reference's next tokens, each right with probability a
    class Oracle final : public Drafter {
     public:
      Oracle(const std::vector<TokenId>& ref, double a, int vocab) : ref_(ref), a_(a), vocab_(vocab) {}
      std::string name() const override { return "oracle"; }
      std::vector<TokenId> draft(std::span<const TokenId> history, int k) override {
        std::vector<TokenId> d;
        for (size_t i = history.size(); i < ref_.size() && int(d.size()) < k; ++i)
          d.push_back(std::uniform_real_distribution<double>(0, 1)(rng_) < a_ ? ref_[i] : (ref_[i] + 1) % vocab_);
        return d;
      }

     private:
      const std::vector<TokenId>& ref_;
      double a_;
      int vocab_;
      std::mt19937 rng_{17};
    };
    Status st = run("", 0, nullptr, 8);  // warm-up: page faults and scratch buffers
    NgramDrafter ngram;
    if (st) st = run("greedy, plain", 0, nullptr, o.gen_tokens);
    if (st) st = run("greedy, n-gram drafts", 0, &ngram, o.gen_tokens);
    // under --routing trace/synthetic the experts follow the trace's positions, which drafts that
    // are then rejected also use up: the output leaves the plain run's, and drafts of it no longer
    // have the rate asked for
    for (double a : {0.5, 0.7, 0.9}) {
      if (engine.routing_override() != nullptr) break;
      Oracle oracle(reference, a, hp.n_vocab);
      if (st) st = run(strfmt("greedy, drafts right with p %.1f", a), 0, &oracle, o.gen_tokens);
    }
    // random weights: the MTP layer's drafts are as good as random ones, so this measures what
    // drafting costs and that the controller turns it down
    if (st && m.mtp != nullptr) st = run("greedy, MTP drafts", 0, nullptr, o.gen_tokens, true);
    if (st) st = run("temperature 1, plain", 1, nullptr, o.gen_tokens);
    if (st) st = run("temperature 1, n-gram drafts", 1, &ngram, o.gen_tokens);
    if (!st) {
      std::fprintf(stderr, "strata bench: %s\n", st.error().message.c_str());
      return 1;
    }
  }
  std::vector<KCost> costs;
  // the steps' spans (per part: attention, experts, head, ...) say where a step's time goes; the
  // profiler is put back as it was however the loop ends
  struct ProfilerOn {
    bool was = prof::g_enabled.load();
    ProfilerOn() { prof::enable(true); }
    ~ProfilerOn() { prof::enable(was); }
  };
  {
    const ProfilerOn on;
    for (int k = 0; k <= o.max_k; ++k) {
      KCost c;
      c.k = k;
      const double gbps_before = cpu::measure_read_gbps(pool), gops_before = cpu::measure_int8_peak_gops(pool);
      // one untimed step first (the expert cache and the scratch buffers settle)
      for (int step = -1; step < o.steps; ++step) {
        const int64_t pos = s.n_past();
        const std::vector<int32_t> batch = random_tokens(k + 1);
        prof::reset();
        const uint64_t nvme0 = store ? store->stats().bytes_read : 0;
        const auto t0 = std::chrono::steady_clock::now();
        s.begin_speculation();
        auto l = s.eval(batch, k > 0);
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (!l) {
          std::fprintf(stderr, "strata bench: %s\n", l.error().message.c_str());
          return 1;
        }
        s.rewind(pos + 1);
        if (step < 0) continue;
        c.seconds += sec / o.steps;
        c.experts += double(prof::g_totals.experts_run.load()) / o.steps;
        c.expert_bytes += double(prof::g_totals.expert_bytes.load()) / o.steps;
        if (store) c.nvme_bytes += double(store->stats().bytes_read - nvme0) / o.steps;
        for (size_t p = 0; p < c.part_s.size(); ++p) c.part_s[p] += 1e-9 * double(prof::g_totals.ns[p].load()) / o.steps;
      }
      c.dram_gbps = 0.5 * (gbps_before + cpu::measure_read_gbps(pool));
      c.int8_gops = 0.5 * (gops_before + cpu::measure_int8_peak_gops(pool));
      c.memory_s = (dense_bytes + c.expert_bytes) / (c.dram_gbps * 1e9);
      // every token multiplies its own weights: 2 ops per weight per token (k + 1 tokens)
      c.compute_s = 2.0 * double(sm.active_params_per_token) * (k + 1) / (c.int8_gops * 1e9);
      if (store && o.nvme_probe_gbps > 0) c.nvme_s = c.nvme_bytes / (o.nvme_probe_gbps * 1e9);
      c.roofline = std::max({c.memory_s, c.compute_s, c.nvme_s});
      const double ops_s = 1.0 / (c.int8_gops * 1e9), bytes_s = 1.0 / (c.dram_gbps * 1e9);
      c.experts_bound = larger(c.expert_bytes * bytes_s, 2.0 * routed_params * (k + 1) * ops_s, c.nvme_s);
      c.rest_bound = larger(dense_bytes * bytes_s, 2.0 * dense_params * (k + 1) * ops_s);
      costs.push_back(c);
    }
  }
  // the MTP drafter's cost: after one plain step, draft(k) = a pass of the MTP layer over the new
  // position (with the head) plus k - 1 chained passes
  std::vector<double> mtp_draft_s;  // [k - 1]
  if (m.mtp != nullptr) {
    Session ms(engine, int(ctx), cpu::MatmulPath::quantized, engine.config().kv_type);
    auto made = MtpDrafter::create(ms);
    if (!made) {
      std::fprintf(stderr, "strata bench: %s\n", made.error().message.c_str());
      return 1;
    }
    std::vector<int32_t> history = random_tokens(std::max(1, o.depth) + 1);
    auto eval_status = [&](std::span<const int32_t> t) -> Status {
      auto l = ms.eval(t);
      return l ? Status::success() : Status(l.error());
    };
    Status st = eval_status(std::span<const int32_t>(history.data(), history.size() - 1));
    for (int k = 1; st && k <= o.max_k; ++k) {
      double sum = 0;
      for (int step = -1; st && step < o.steps; ++step) {  // one untimed
        st = eval_status(std::span<const int32_t>(&history.back(), 1));
        history.push_back(random_tokens(1)[0]);
        const auto t = std::chrono::steady_clock::now();
        (*made)->draft(history, k);
        if (step >= 0) sum += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
      }
      mtp_draft_s.push_back(sum / o.steps);
    }
    if (!st) {
      std::fprintf(stderr, "strata bench: %s\n", st.error().message.c_str());
      return 1;
    }
  }
  const double t0 = costs[0].seconds;
  const double layers = double(std::max<uint64_t>(1, sm.n_moe_layers));
  const std::vector<double> rates = {0.3, 0.5, 0.6, 0.7, 0.8, 0.9};
  // per acceptance rate: the best k over the measured curve and its speed-up over plain decoding
  std::vector<std::pair<int, double>> best;
  for (double a : rates) {
    std::pair<int, double> b{0, 1.0};
    for (const KCost& c : costs) {
      const double s_up = tokens_per_step(a, c.k) * t0 / c.seconds;
      if (s_up > b.second) b = {c.k, s_up};
    }
    best.push_back(b);
  }
  if (o.json) {
    nlohmann::json j;
    j["model"] = sm.name.empty() ? sm.arch : sm.name;
    j["depth"] = o.depth;
    j["steps"] = o.steps;
    for (const KCost& c : costs) {
      j["curve"].push_back({{"k", c.k}, {"step_s", c.seconds}, {"vs_plain", c.seconds / t0},
                            {"experts_per_layer", c.experts / layers}, {"bytes", dense_bytes + c.expert_bytes},
                            {"nvme_bytes", c.nvme_bytes}, {"dram_gbps", c.dram_gbps}, {"int8_gops", c.int8_gops},
                            {"memory_s", c.memory_s}, {"compute_s", c.compute_s}, {"nvme_s", c.nvme_s},
                            {"roofline_s", c.roofline},
                            {"of_roofline", c.roofline / c.seconds}});
      nlohmann::json parts;
      for (size_t p = 0; p < c.part_s.size(); ++p) parts[std::string(prof::kPartNames[p])] = c.part_s[p];
      j["curve"].back()["parts_s"] = parts;
      j["curve"].back()["experts_bound_s"] = c.experts_bound.s;
      j["curve"].back()["rest_bound_s"] = c.rest_bound.s;
      j["curve"].back()["of_per_part_bound"] = (c.experts_bound.s + c.rest_bound.s) / c.seconds;
    }
    for (size_t i = 0; i < rates.size(); ++i)
      j["speedup"].push_back({{"acceptance", rates[i]}, {"best_k", best[i].first}, {"speedup", best[i].second}});
    for (size_t i = 0; i < mtp_draft_s.size(); ++i)
      j["mtp_draft"].push_back({{"k", i + 1}, {"seconds", mtp_draft_s[i]}, {"vs_plain_step", mtp_draft_s[i] / t0}});
    for (const EndToEnd& e : e2e)
      j["end_to_end"].push_back({{"run", e.what}, {"tps", e.tps}, {"vs_plain", e.vs_plain}, {"steps", e.r.n_steps},
                                 {"drafted", e.r.n_drafted}, {"accepted", e.r.n_accepted}});
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  const double n_exp = double(sm.n_expert), k_used = double(sm.n_expert_used);
  std::printf("speculative verification: one eval of k+1 tokens at depth %d, mean of %d steps per k\n\n", o.depth, o.steps);
  std::printf("| %2s | %8s | %7s | %13s | %13s | %8s | %9s | %9s | %10s | %9s | %8s |\n", "k", "step ms", "x plain",
              "experts/layer", "(independent)", "GB read", "from NVMe", "memory ms", "compute ms", "NVMe ms", "of bound");
  std::printf("|----|----------|---------|---------------|---------------|----------|-----------|-----------|------------|-----------|----------|\n");
  for (const KCost& c : costs) {
    // independent routing: each of n experts is missed by all k+1 tokens with (1 - used/n)^(k+1)
    const double indep = n_exp > 0 ? n_exp * (1 - std::pow(1 - k_used / n_exp, c.k + 1)) : 0;
    std::printf("| %2d | %8.2f | %7.2f | %13.1f | %13.1f | %8.3f | %9.3f | %9.2f | %10.2f | %9.2f | %8.2f |\n", c.k,
                1e3 * c.seconds, c.seconds / t0, c.experts / layers, indep, (dense_bytes + c.expert_bytes) / 1e9,
                c.nvme_bytes / 1e9, 1e3 * c.memory_s, 1e3 * c.compute_s, 1e3 * c.nvme_s, c.roofline / c.seconds);
  }
  std::printf("memory: the step's weight bytes (dense + the routed experts it computed) over the DRAM read rate; "
              "compute: 2 ops per weight per token over the int8 peak; NVMe: bytes read from disk over the disk "
              "probe; of bound: the largest of the three over the step's time\n");
  // the routed experts are read once per step whatever k; everything else (attention, router,
  // shared experts, head) reads its weights once but computes them k + 1 times
  using prof::Part;
  std::printf("\nwhere a step's time goes (ms), and each part's bound:\n\n");
  std::printf("| %2s | %9s | %6s | %7s | %6s | %6s | %8s | %9s | %8s | %10s | %8s | %8s |\n", "k", "attention", "router",
              "shared", "head", "other", "rest", "bound", "experts", "bound", "per-part", "of it");
  std::printf("|----|-----------|--------|---------|--------|--------|----------|-----------|----------|------------|----------|----------|\n");
  for (const KCost& c : costs) {
    const auto ms = [&](Part p) { return 1e3 * c.part_s[size_t(p)]; };
    const double experts = ms(Part::experts), rest = 1e3 * c.seconds - experts;
    const double parts = ms(Part::embed) + ms(Part::attention) + ms(Part::router) + experts +
                         ms(Part::shared_ffn) + ms(Part::output) + ms(Part::sample);
    std::printf("| %2d | %9.2f | %6.2f | %7.2f | %6.2f | %6.2f | %8.2f | %5.1f %s | %8.2f | %6.1f %s | %8.2f | %8.2f |\n",
                c.k, ms(Part::attention), ms(Part::router), ms(Part::shared_ffn), ms(Part::output),
                1e3 * c.seconds - parts, rest, 1e3 * c.rest_bound.s, c.rest_bound.kind, experts,
                1e3 * c.experts_bound.s, c.experts_bound.kind, 1e3 * (c.experts_bound.s + c.rest_bound.s),
                (c.experts_bound.s + c.rest_bound.s) / c.seconds);
  }
  std::printf("rest: the step outside the routed experts (attention with its projections, router, shared experts, "
              "head), which reads its weights once but multiplies them k + 1 times; each part's bound is the larger "
              "of its weight bytes over the DRAM rate (mem) and 2 ops per weight per token over the int8 peak (cmp); "
              "the parts run one after the other, so the step's per-part bound is their sum\n");
  std::printf("\nspeed-up over plain decoding by acceptance rate (per drafted token), best k on this curve:\n");
  for (size_t i = 0; i < rates.size(); ++i)
    std::printf("  acceptance %.1f: k = %d, %.2fx\n", rates[i], best[i].first, best[i].second);
  if (!mtp_draft_s.empty()) {
    std::printf("\nMTP drafts (the model's nextn layer), after one plain step, mean of %d:\n", o.steps);
    for (size_t i = 0; i < mtp_draft_s.size(); ++i)
      std::printf("  k = %zu: %7.2f ms, %.3f of a plain step\n", i + 1, 1e3 * mtp_draft_s[i], mtp_draft_s[i] / t0);
  }
  if (!e2e.empty())
    std::printf("\nend to end, %d tokens after a %d-token prompt, adaptive k <= %d:\n", o.gen_tokens, std::max(1, o.depth),
                o.max_k);
  if (!e2e.empty() && engine.routing_override() != nullptr)
    std::printf("  (drafts right at a set rate: only with --routing model; a replayed trace's positions are used up by "
                "rejected drafts, so the output leaves the plain run's)\n");
  for (const EndToEnd& e : e2e) {
    std::printf("  %-34s %7.2f tok/s  %5.2fx  %4d steps, %4d drafted, %4d accepted\n", e.what.c_str(), e.tps,
                e.vs_plain, e.r.n_steps, e.r.n_drafted, e.r.n_accepted);
  }
  return 0;
}

}  // namespace strata::cli
