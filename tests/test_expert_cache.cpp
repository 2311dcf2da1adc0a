// Expert cache policies, the exclusive VRAM / RAM replay, Belady's bound, the routing-trace reader
// and the synthetic trace generator; `strata replay` end to end.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "storage/expert_cache.h"
#include "storage/routing_trace.h"
#include "test_support.h"

namespace fs = std::filesystem;

namespace strata {
namespace {

// A trace from (layer, experts) steps.
RoutingTrace make_trace(int32_t n_layer, int32_t n_expert,
                        const std::vector<std::pair<int32_t, std::vector<int32_t>>>& steps) {
  RoutingTrace t;
  t.source = "hand-made";
  t.n_layer = n_layer;
  t.n_expert = n_expert;
  for (const auto& [layer, experts] : steps) {
    t.steps.push_back({.layer = layer, .token_pos = 0, .first = uint32_t(t.experts.size()),
                       .count = uint32_t(experts.size())});
    t.experts.insert(t.experts.end(), experts.begin(), experts.end());
    t.top_k = std::max(t.top_k, int32_t(experts.size()));
  }
  return t;
}

// One expert per step, all in layer 0.
RoutingTrace sequence(int32_t n_expert, const std::vector<int32_t>& experts) {
  std::vector<std::pair<int32_t, std::vector<int32_t>>> steps;
  for (int32_t e : experts) steps.push_back({0, {e}});
  return make_trace(1, n_expert, steps);
}

int64_t hits(const RoutingTrace& t, CachePolicyKind kind, int64_t capacity, double half_life = 64) {
  return replay_trace(t, {.kind = kind, .half_life_tokens = half_life},
                      {.vram_experts = capacity, .ram_experts = 0})
      .total.vram_hits;
}

RoutingTrace synthetic(int32_t n_layer, int32_t n_expert, int32_t top_k, int64_t n_tokens,
                       double zipf, double repeat, uint64_t seed, double drift = 0) {
  auto t = synthetic_routing_trace({.n_layer = n_layer, .n_expert = n_expert, .top_k = top_k,
                                    .n_tokens = n_tokens, .zipf_s = zipf, .repeat = repeat,
                                    .drift = drift, .seed = seed});
  EXPECT_TRUE(t.ok()) << t.error().message;
  return std::move(t).value();
}

int64_t distinct_experts(const RoutingTrace& t) {
  std::set<std::pair<int32_t, int32_t>> seen;
  for (const RoutingStep& s : t.steps)
    for (int32_t e : t.experts_of(s)) seen.insert({s.layer, e});
  return int64_t(seen.size());
}

std::optional<fs::path> traces_dir() {
  if (const char* env = std::getenv("STRATA_TRACES")) {
    if (fs::is_directory(env)) return fs::path(env);
  }
  fs::path p = fs::path(STRATA_SOURCE_DIR).parent_path() / "shared" / "traces";
  if (fs::is_directory(p)) return p;
  return std::nullopt;
}

constexpr double kNoDecay = std::numeric_limits<double>::infinity();
constexpr const char* kMixtralTrace = "mixtral-8x7b-humaneval-routing.jsonl";

// ---- policies on hand-made traces ----

TEST(ExpertCache, LruEvictsLeastRecent) {
  // a b a c b with 2 slots: c evicts b (least recent), so b misses again.
  const RoutingTrace t = sequence(4, {0, 1, 0, 2, 1});
  EXPECT_EQ(hits(t, CachePolicyKind::lru, 2), 1);

  LruPolicy p;
  p.reset({.n_layer = 1, .n_expert = 4}, 2);
  EXPECT_EQ(p.insert(0), kNoExpert);
  EXPECT_EQ(p.insert(1), kNoExpert);
  p.observe(0, 2);                 // 0 is now the most recent
  EXPECT_EQ(p.insert(2), 1);       // so 1 goes
  EXPECT_TRUE(p.contains(0));
  EXPECT_FALSE(p.contains(1));
  p.erase(0);
  EXPECT_EQ(p.insert(3), kNoExpert);  // erase freed a slot
}

TEST(ExpertCache, LfuKeepsTheFrequentOne) {
  // a a a b c a with 2 slots: LRU lets c push a out, LFU pushes out b (seen once, and older).
  const RoutingTrace t = sequence(4, {0, 0, 0, 1, 2, 0});
  EXPECT_EQ(hits(t, CachePolicyKind::lru, 2), 2);
  EXPECT_EQ(hits(t, CachePolicyKind::lfu_decay, 2, kNoDecay), 3);
  EXPECT_EQ(hits(t, CachePolicyKind::lfu_decay, 2, 64), 3);
}

TEST(ExpertCache, LfuDeclinesAOneOffAccess) {
  // a a a b a with 1 slot: b scores below a and is not admitted, so a still hits.
  const RoutingTrace t = sequence(2, {0, 0, 0, 1, 0});
  EXPECT_EQ(hits(t, CachePolicyKind::lfu_decay, 1, kNoDecay), 3);
  EXPECT_EQ(hits(t, CachePolicyKind::lru, 1), 2);
}

TEST(ExpertCache, LfuDecayForgetsOldPopularity) {
  // a five times, then b ten times, 1 slot. Without decay b has to catch up with a's count first
  // (admitted at its 5th access, a tie that recency breaks); with a half-life of one token a's old
  // count has faded by b's first access.
  std::vector<int32_t> seq(5, 0);
  seq.insert(seq.end(), 10, 1);
  const RoutingTrace t = sequence(2, seq);
  EXPECT_EQ(hits(t, CachePolicyKind::lfu_decay, 1, kNoDecay), 4 + 5);
  EXPECT_EQ(hits(t, CachePolicyKind::lfu_decay, 1, 1.0), 4 + 9);
}

TEST(ExpertCache, LfuWithAShortHalfLifeIsLru) {
  // When the last access outweighs all older ones together (half-life 1/20 token), the score
  // orders by recency: LFU makes LRU's decisions. Top-1 so that no two accesses share a step; long
  // enough that the weights are rescaled many times.
  const RoutingTrace t = synthetic(1, 16, 1, 5000, 0.8, 0.2, 7);
  for (int64_t c : {1, 3, 8, 15}) {
    EXPECT_EQ(hits(t, CachePolicyKind::lfu_decay, c, 0.05), hits(t, CachePolicyKind::lru, c)) << c;
  }
}

TEST(ExpertCache, BeladyIsOptimalWhereLruIsNot) {
  // a b c a b c with 2 slots: LRU always evicts the one needed next (0 hits); Belady declines c
  // (needed last) and hits a and b.
  const RoutingTrace t = sequence(3, {0, 1, 2, 0, 1, 2});
  EXPECT_EQ(hits(t, CachePolicyKind::lru, 2), 0);
  EXPECT_EQ(belady_hits(t, 2), 2);
  EXPECT_EQ(belady_hits(t, 3), 3);
  EXPECT_EQ(belady_hits(t, 1), 1);  // keeps a through b and c
}

TEST(ExpertCache, LayerLruSplitsSlotsPerLayer) {
  // Layer 0 alternates between two experts, layer 1 never comes: 2 global slots hold both, the
  // per-layer split gives layer 0 one slot only.
  const RoutingTrace t = make_trace(2, 4, {{0, {0}}, {0, {1}}, {0, {0}}, {0, {1}}});
  EXPECT_EQ(hits(t, CachePolicyKind::lru, 2), 2);
  EXPECT_EQ(hits(t, CachePolicyKind::layer_lru, 2), 0);
  // 3 slots over 2 layers: the first layer gets the extra one.
  EXPECT_EQ(hits(t, CachePolicyKind::layer_lru, 3), 2);

  LayerLruPolicy p;
  p.reset({.n_layer = 2, .n_expert = 4}, 2);
  EXPECT_EQ(p.insert(0), kNoExpert);  // layer 0
  EXPECT_EQ(p.insert(4), kNoExpert);  // layer 1
  EXPECT_EQ(p.insert(1), 0);          // layer 0 evicts its own, never layer 1's
  EXPECT_TRUE(p.contains(4));
  LayerLruPolicy small;
  small.reset({.n_layer = 2, .n_expert = 4}, 1);
  EXPECT_EQ(small.insert(5), 5);  // layer 1 has no slot: declined
}

TEST(ExpertCache, CapacityZeroAndCapacityForEverything) {
  const RoutingTrace t = synthetic(4, 8, 2, 300, 1.0, 0.3, 3);
  const int64_t n = t.n_accesses();
  const int64_t compulsory = distinct_experts(t);
  for (CachePolicyKind k : kAllCachePolicies) {
    SCOPED_TRACE(std::string(cache_policy_name(k)));
    const ReplayResult none = replay_trace(t, {.kind = k}, {.vram_experts = 0, .ram_experts = 0});
    EXPECT_EQ(none.total.accesses, n);
    EXPECT_EQ(none.total.misses, n);
    EXPECT_EQ(none.total.vram_hits + none.total.ram_hits, 0);
    EXPECT_DOUBLE_EQ(none.misses_per_token(), double(n) / 300.0);
    // Every expert fits: only first uses miss, whichever tier has the room.
    EXPECT_EQ(hits(t, k, 4 * 8), n - compulsory);
    EXPECT_EQ(hits(t, k, 1000), n - compulsory);
    const ReplayResult ram = replay_trace(t, {.kind = k}, {.vram_experts = 0, .ram_experts = 32});
    EXPECT_EQ(ram.total.ram_hits, n - compulsory);
    EXPECT_EQ(ram.total.misses, compulsory);
  }
  EXPECT_EQ(belady_hits(t, 0), 0);
  EXPECT_EQ(belady_hits(t, 32), n - compulsory);
  EXPECT_EQ(belady_hits(t, 1000), n - compulsory);
}

// ---- tiers ----

TEST(ExpertCache, ExclusiveTiersByHand) {
  // VRAM 1, RAM 1, LRU: a b a c a
  //   a: NVMe -> VRAM{a}        b: NVMe -> VRAM{b} RAM{a}     a: RAM hit -> VRAM{a} RAM{b}
  //   c: NVMe -> VRAM{c} RAM{a} (b dropped)                   a: RAM hit
  const RoutingTrace t = sequence(3, {0, 1, 0, 2, 0});
  const ReplayResult r =
      replay_trace(t, {.kind = CachePolicyKind::lru}, {.vram_experts = 1, .ram_experts = 1});
  EXPECT_EQ(r.total.accesses, 5);
  EXPECT_EQ(r.total.vram_hits, 0);
  EXPECT_EQ(r.total.ram_hits, 2);
  EXPECT_EQ(r.total.misses, 3);
  ASSERT_EQ(r.per_layer.size(), 1u);
  EXPECT_EQ(r.per_layer[0].ram_hits, 2);
  EXPECT_DOUBLE_EQ(r.misses_per_token(), 3.0 / 5.0);
}

TEST(ExpertCache, TiersStayExclusiveAndWithinCapacity) {
  const RoutingTrace t = synthetic(3, 16, 4, 400, 1.1, 0.3, 11);
  const CacheShape shape{.n_layer = t.n_layer, .n_expert = t.n_expert};
  for (CachePolicyKind k : kAllCachePolicies) {
    SCOPED_TRACE(std::string(cache_policy_name(k)));
    TierSim sim(shape, {.kind = k, .half_life_tokens = 8}, {.vram_experts = 7, .ram_experts = 11});
    int64_t step = 0;
    for (const RoutingStep& s : t.steps) {
      for (int32_t e : t.experts_of(s)) {
        const ExpertKey key = shape.key(s.layer, e);
        const bool was_vram = sim.vram().contains(key), was_ram = sim.ram().contains(key);
        const Tier tier = sim.access(s.layer, e, step);
        EXPECT_EQ(tier, was_vram ? Tier::vram : was_ram ? Tier::ram : Tier::nvme);
      }
      int n_vram = 0, n_ram = 0;
      for (ExpertKey k2 = 0; k2 < shape.n_keys(); ++k2) {
        ASSERT_FALSE(sim.vram().contains(k2) && sim.ram().contains(k2)) << "expert in both tiers";
        n_vram += sim.vram().contains(k2);
        n_ram += sim.ram().contains(k2);
      }
      ASSERT_LE(n_vram, 7);
      ASSERT_LE(n_ram, 11);
      ++step;
    }
  }
}

TEST(ExpertCache, LruTiersAreOneLruStack) {
  // With LRU in both tiers, VRAM holds the V most recent experts and RAM the next R.
  const RoutingTrace t = synthetic(4, 32, 4, 500, 0.9, 0.2, 5);
  for (int64_t v : {0, 5, 20, 64}) {
    for (int64_t ram : {0, 9, 40}) {
      const ReplayResult r =
          replay_trace(t, {.kind = CachePolicyKind::lru}, {.vram_experts = v, .ram_experts = ram});
      EXPECT_EQ(r.total.vram_hits, hits(t, CachePolicyKind::lru, v));
      EXPECT_EQ(r.total.vram_hits + r.total.ram_hits, hits(t, CachePolicyKind::lru, v + ram));
    }
  }
}

TEST(ExpertCache, BeladyBoundsEveryPolicy) {
  struct Case {
    int32_t n_layer, n_expert, top_k;
    double zipf, repeat;
  };
  const Case cases[] = {{4, 8, 2, 0.0, 0.0},   // uniform random
                        {4, 8, 2, 1.2, 0.3},   // skewed, with locality
                        {6, 64, 6, 1.0, 0.0},  // wide layers
                        {2, 16, 1, 2.0, 0.5}};  // very skewed, top-1
  uint64_t seed = 1;
  for (const Case& c : cases) {
    const RoutingTrace t =
        synthetic(c.n_layer, c.n_expert, c.top_k, 400, c.zipf, c.repeat, seed, seed % 2 ? 0.1 : 0.0);
    ++seed;
    const int64_t n_keys = int64_t(c.n_layer) * c.n_expert;
    for (int64_t cap : {int64_t(1), int64_t(c.n_layer), n_keys / 4, n_keys / 2, n_keys - 1}) {
      const int64_t best = belady_hits(t, cap);
      for (CachePolicyKind k : kAllCachePolicies) {
        for (double hl : {4.0, 64.0, kNoDecay}) {
          EXPECT_LE(hits(t, k, cap, hl), best) << cache_policy_name(k) << " cap " << cap;
        }
        // Two tiers: VRAM by Belady(V), VRAM + RAM by Belady(V + R).
        const ReplayResult r =
            replay_trace(t, {.kind = k}, {.vram_experts = cap / 2, .ram_experts = cap - cap / 2});
        EXPECT_LE(r.total.vram_hits, belady_hits(t, cap / 2));
        EXPECT_LE(r.total.vram_hits + r.total.ram_hits, best);
      }
      if (cap > 1) {
        EXPECT_GE(best, belady_hits(t, cap - 1));  // more room never hurts Belady
      }
    }
  }
}

// ---- traces ----

TEST(RoutingTrace, ReadsJsonl) {
  const fs::path dir = test::scratch_dir("routing_trace_good");
  const fs::path f = dir / "good.jsonl";
  std::ofstream(f) << "{\"dataset\": \"x\", \"layer\": 1, \"token_pos\": 0, \"experts\": [5, 2], "
                      "\"gating_probs\": [0.7, 0.3]}\r\n"
                   << "\n"
                   << "{\"layer\": 0, \"token_pos\": 3, \"experts\": [0, 7, 1]}\n"
                   << "{\"layer\": 1, \"token_pos\": 1, \"experts\": [2]}";  // no final newline
  auto t = read_routing_trace(f.string());
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t->n_layer, 2);
  EXPECT_EQ(t->n_expert, 8);
  EXPECT_EQ(t->top_k, 3);
  ASSERT_EQ(t->steps.size(), 3u);
  EXPECT_EQ(t->steps[0].layer, 1);
  EXPECT_EQ(t->steps[1].token_pos, 3);
  EXPECT_EQ(std::vector<int32_t>(t->experts_of(t->steps[1]).begin(), t->experts_of(t->steps[1]).end()),
            (std::vector<int32_t>{0, 7, 1}));
  EXPECT_EQ(t->n_accesses(), 6);
  EXPECT_DOUBLE_EQ(t->n_tokens(), 1.5);
}

TEST(RoutingTrace, BadInputIsAnErrorNamingFileAndLine) {
  const fs::path dir = test::scratch_dir("routing_trace_bad");
  const std::string good = "{\"layer\": 0, \"token_pos\": 0, \"experts\": [1, 2]}\n";
  struct Case {
    std::string line;  // written as line 2, after a good line
    std::string want;  // part of the message
  };
  const Case cases[] = {
      {"{\"layer\": 0, \"token_pos\": 1, \"experts\": [1, 2]", "malformed JSON"},
      {"not json at all", "malformed JSON"},
      {"[1, 2]", "expected a JSON object"},
      {"{\"token_pos\": 1, \"experts\": [1, 2]}", "missing field \"layer\""},
      {"{\"layer\": 0, \"experts\": [1, 2]}", "missing field \"token_pos\""},
      {"{\"layer\": 0, \"token_pos\": 1}", "missing field \"experts\""},
      {"{\"layer\": 0, \"token_pos\": 1, \"experts\": [1, -2]}", "\"experts\"[1] is -2, must be >= 0"},
      {"{\"layer\": -1, \"token_pos\": 1, \"experts\": [1]}", "\"layer\" is -1, must be >= 0"},
      {"{\"layer\": \"3\", \"token_pos\": 1, \"experts\": [1]}", "\"layer\" is string, expected an integer"},
      {"{\"layer\": 3.5, \"token_pos\": 1, \"experts\": [1]}", "expected an integer"},
      {"{\"layer\": 0, \"token_pos\": 1, \"experts\": 4}", "expected a non-empty array"},
      {"{\"layer\": 0, \"token_pos\": 1, \"experts\": []}", "an empty array"},
      {"{\"layer\": 0, \"token_pos\": 1, \"experts\": [1, \"2\"]}", "\"experts\"[1] is string"},
      {"{\"layer\": 0, \"token_pos\": 1, \"experts\": [1, 2.0]}", "expected an integer"},
      {"{\"layer\": 0, \"token_pos\": 1, \"experts\": [3, 3]}", "expert 3 listed twice"},
      {"{\"layer\": 0, \"token_pos\": 1, \"experts\": [99999999999]}", "above the limit"},
      {"{\"layer\": 100000, \"token_pos\": 1, \"experts\": [1]}", "above the limit"},
  };
  int i = 0;
  for (const Case& c : cases) {
    const fs::path f = dir / ("bad" + std::to_string(i++) + ".jsonl");
    std::ofstream(f) << good << c.line << "\n" << good;
    auto t = read_routing_trace(f.string());
    ASSERT_FALSE(t.ok()) << c.line;
    EXPECT_NE(t.error().message.find(f.string() + ":2: "), std::string::npos) << t.error().message;
    EXPECT_NE(t.error().message.find(c.want), std::string::npos) << t.error().message;
  }
  const fs::path empty = dir / "empty.jsonl";
  std::ofstream(empty) << "\n  \n";
  auto e = read_routing_trace(empty.string());
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("no routing records"), std::string::npos) << e.error().message;
  auto missing = read_routing_trace((dir / "absent.jsonl").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("absent.jsonl"), std::string::npos);
}

TEST(RoutingTrace, SyntheticIsSeededSkewedAndWellFormed) {
  const RoutingTrace a = synthetic(5, 32, 4, 300, 1.0, 0.2, 9);
  const RoutingTrace b = synthetic(5, 32, 4, 300, 1.0, 0.2, 9);
  const RoutingTrace c = synthetic(5, 32, 4, 300, 1.0, 0.2, 10);
  EXPECT_EQ(a.experts, b.experts);
  EXPECT_NE(a.experts, c.experts);
  ASSERT_EQ(a.steps.size(), 5u * 300u);
  EXPECT_EQ(a.n_accesses(), 5 * 300 * 4);
  for (size_t i = 0; i < a.steps.size(); ++i) {
    const RoutingStep& s = a.steps[i];
    EXPECT_EQ(s.layer, int32_t(i % 5));  // token-major
    EXPECT_EQ(s.token_pos, int32_t(i / 5));
    std::set<int32_t> distinct(a.experts_of(s).begin(), a.experts_of(s).end());
    EXPECT_EQ(distinct.size(), 4u);
    for (int32_t e : distinct) EXPECT_TRUE(e >= 0 && e < 32);
  }
  // Skew and locality both raise LRU's hit rate above uniform routing's.
  const RoutingTrace uniform = synthetic(5, 32, 4, 300, 0.0, 0.0, 9);
  const RoutingTrace local = synthetic(5, 32, 4, 300, 0.0, 0.6, 9);
  const int64_t cap = 5 * 8;
  EXPECT_GT(hits(a, CachePolicyKind::layer_lru, cap), hits(uniform, CachePolicyKind::layer_lru, cap));
  EXPECT_GT(hits(local, CachePolicyKind::layer_lru, cap), hits(uniform, CachePolicyKind::layer_lru, cap));
  // Uniform: about cap / n_keys = 25% for any policy.
  EXPECT_NEAR(double(hits(uniform, CachePolicyKind::layer_lru, cap)) / double(uniform.n_accesses()),
              0.25, 0.03);
  // Extreme skew with top_k = n_expert still terminates with every expert once.
  const RoutingTrace all = synthetic(1, 8, 8, 20, 8.0, 0.0, 1);
  for (const RoutingStep& s : all.steps)
    EXPECT_EQ(std::set<int32_t>(all.experts_of(s).begin(), all.experts_of(s).end()).size(), 8u);

  // Drift: with fixed popularity a long memory wins (LFU without decay beats a half-life of 4
  // tokens); once popularity moves, the decayed one wins.
  const RoutingTrace steady = synthetic(8, 16, 2, 3000, 1.0, 0.0, 3, 0.0);
  const RoutingTrace drifting = synthetic(8, 16, 2, 3000, 1.0, 0.0, 3, 0.1);
  EXPECT_NE(steady.experts, drifting.experts);
  EXPECT_GT(hits(steady, CachePolicyKind::lfu_decay, 32, kNoDecay),
            hits(steady, CachePolicyKind::lfu_decay, 32, 4));
  EXPECT_LT(hits(drifting, CachePolicyKind::lfu_decay, 32, kNoDecay),
            hits(drifting, CachePolicyKind::lfu_decay, 32, 4));
  EXPECT_TRUE(synthetic_routing_trace({}).ok());  // the defaults: qwen3-30b-a3b's shape

  EXPECT_FALSE(synthetic_routing_trace({.n_expert = 4, .top_k = 5}).ok());
  EXPECT_FALSE(synthetic_routing_trace({.drift = 2}).ok());
  EXPECT_FALSE(synthetic_routing_trace({.n_layer = 0}).ok());
  EXPECT_FALSE(synthetic_routing_trace({.repeat = 1.5}).ok());
  EXPECT_FALSE(synthetic_routing_trace({.zipf_s = -1}).ok());
}

TEST(RoutingTrace, TokenMajorOrderKeepsEachLayersSequence) {
  // Layer-major as the Mixtral file's decode part: all of layer 0, then all of layer 1.
  const RoutingTrace t = make_trace(2, 4, {{0, {0}}, {0, {1}}, {0, {2}}, {1, {3}}, {1, {0}}});
  const RoutingTrace tm = token_major_order(t);
  ASSERT_EQ(tm.steps.size(), 5u);
  std::vector<std::pair<int32_t, int32_t>> got;
  for (const RoutingStep& s : tm.steps) got.push_back({s.layer, tm.experts_of(s)[0]});
  EXPECT_EQ(got, (std::vector<std::pair<int32_t, int32_t>>{{0, 0}, {1, 3}, {0, 1}, {1, 0}, {0, 2}}));
  // Per-layer policies do not see the difference.
  const RoutingTrace s = synthetic(6, 8, 2, 200, 1.0, 0.2, 4);
  RoutingTrace layer_major = s;
  layer_major.steps.clear();
  for (int32_t l = 0; l < s.n_layer; ++l)
    for (const RoutingStep& st : s.steps)
      if (st.layer == l) layer_major.steps.push_back(st);
  EXPECT_EQ(hits(layer_major, CachePolicyKind::layer_lru, 18), hits(s, CachePolicyKind::layer_lru, 18));
  const RoutingTrace back = token_major_order(layer_major);
  ASSERT_EQ(back.steps.size(), s.steps.size());
  for (size_t i = 0; i < s.steps.size(); ++i) {
    ASSERT_EQ(back.steps[i].layer, s.steps[i].layer);
    ASSERT_EQ(back.experts_of(back.steps[i])[0], s.experts_of(s.steps[i])[0]);
  }
}

// The real Mixtral-8x7B trace (../shared/traces): shape, and per-layer LRU near the README's
// figures (2 / 4 / 6 of 8 experts per layer: about 32% / 61% / 83%).
TEST(RoutingTrace, MixtralTraceMatchesPublishedLruFigures) {
  const auto dir = traces_dir();
  if (!dir || !fs::exists(*dir / kMixtralTrace))
    GTEST_SKIP() << "../shared/traces/" << kMixtralTrace
                 << " not found (set STRATA_TRACES to its directory): real-trace check skipped";
  auto t = read_routing_trace((*dir / kMixtralTrace).string());
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t->n_layer, 32);
  EXPECT_EQ(t->n_expert, 8);
  EXPECT_EQ(t->top_k, 2);
  EXPECT_EQ(t->steps.size(), 6777u);
  const double want[] = {0.32, 0.61, 0.83};
  for (int i = 0; i < 3; ++i) {
    const int64_t cap = 32 * (2 + 2 * i);
    const double rate = double(hits(*t, CachePolicyKind::layer_lru, cap)) / double(t->n_accesses());
    EXPECT_NEAR(rate, want[i], 0.05) << cap / 32 << " of 8 experts per layer";
    for (CachePolicyKind k : kAllCachePolicies) EXPECT_LE(hits(*t, k, cap), belady_hits(*t, cap));
  }
}

// ---- strata replay ----

TEST(Replay, CliReportsTiersAndBelady) {
  std::string out;
  ASSERT_EQ(test::run_cli("replay --synthetic 4x16x2 --tokens 200 --zipf 1 --vram-experts 8 "
                          "--ram-experts 16 --policy lru",
                          &out),
            0)
      << out;
  for (const char* want : {"4 layers x 16 experts, top-2", "VRAM", "RAM", "NVMe", "per token",
                           "Belady", "with 8 slots", "with 24 slots"})
    EXPECT_NE(out.find(want), std::string::npos) << want << "\n" << out;

  ASSERT_EQ(test::run_cli("replay --synthetic 4x16x2 --tokens 200 --all --order token", &out), 0) << out;
  for (const char* want : {"| slots C |", "layer-lru", "belady", "| 8 | 2 of 16 |", "| 56 | 14 of 16 |"})
    EXPECT_NE(out.find(want), std::string::npos) << want << "\n" << out;

  const fs::path dir = test::scratch_dir("replay_cli");
  std::ofstream(dir / "bad.jsonl") << "{\"layer\": 0, \"token_pos\": 0, \"experts\": [1]}\n{oops\n";
  EXPECT_EQ(test::run_cli("replay --trace " + (dir / "bad.jsonl").string(), &out), 1);
  EXPECT_NE(out.find("bad.jsonl:2: malformed JSON"), std::string::npos) << out;
  EXPECT_EQ(test::run_cli("replay --synthetic 4x16x2 --policy fifo", &out), 1);
  EXPECT_NE(out.find("--policy fifo"), std::string::npos) << out;
  EXPECT_EQ(test::run_cli("replay", &out), 1);
  EXPECT_NE(out.find("--trace"), std::string::npos) << out;
}

}  // namespace
}  // namespace strata
