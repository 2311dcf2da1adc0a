// The NVMe tier's expert store (storage/expert_store.h): a model whose routed experts are streamed
// through a cache far smaller than them computes exactly what the all-in-RAM model computes, with
// the reader misbehaving or not; a failed read is an error naming file and offset, never silent
// zeros; a slot is never overwritten while an expert in it is in use.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <filesystem>
#include <random>

#include "base/profiler.h"
#include "engine/config.h"
#include "engine/session.h"
#include "model/model_info.h"
#include "model/synth.h"
#include "engine/engine.h"
#include "engine/gpu_tier.h"
#include "storage/expert_store.h"

namespace strata {
namespace {

// A synthetic model written to a temporary file once per shape.
class StreamedModel {
 public:
  explicit StreamedModel(std::string_view shape_name) {
    const SynthShape* shape = find_synth_shape(shape_name);
    STRATA_CHECK(shape != nullptr);
    auto plan = build_synth_plan(*shape, SynthQuant::q4_k_m, {.seed = 7});
    STRATA_CHECK(plan.ok());
    path_ = ::testing::TempDir() + "strata-expert-store-" + std::string(shape_name) + "-" + std::to_string(::getpid()) + ".gguf";
    STRATA_CHECK(plan->write_file(path_).ok());
  }
  ~StreamedModel() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

  // Faults on every read touching layer `layer`'s gate matrix of `expert` (all experts: -1).
  storage::FaultInjection failing_gate(int layer, int expert = -1) const {
    auto m = Model::load(path_, MappedFile::Mode::mmap, true, /*stream_experts=*/true);
    STRATA_CHECK(m.ok());
    const Weight& gate = (*m)->layers[size_t(layer)].gate_exps;
    storage::FaultInjection f;
    f.fail_file = 0;
    f.fail_offset = uint64_t(gate.data - (*m)->file().bytes_.data()) + uint64_t(std::max(expert, 0)) * gate.mat_bytes();
    f.fail_bytes = expert < 0 ? gate.mat_bytes() * uint64_t(gate.n_mat) : 1;
    return f;
  }

  std::unique_ptr<Model> in_ram() const {
    auto m = Model::load(path_, MappedFile::Mode::ram, true);
    STRATA_CHECK(m.ok());
    return std::move(*m);
  }
  // Streamed, with a cache of the fewest slots the store accepts plus `extra` (negative: too few).
  Result<std::unique_ptr<Engine>> streamed(int64_t extra, ExpertStoreOptions o) const {
    auto loaded = Model::load(path_, MappedFile::Mode::mmap, true, /*stream_experts=*/true);
    if (!loaded) return loaded.error();
    auto m = std::make_unique<Engine>(std::move(*loaded));
    const ExpertLayout layout = expert_layout(m->model());
    // the slot size, from a first store with plenty of room
    ExpertStoreOptions probe = o;
    probe.cache_bytes = uint64_t(1) << 30;
    auto s = ExpertStore::open(layout, path_, probe);
    if (!s) return s.error();
    o.cache_bytes = uint64_t((*s)->min_slots() + extra) * (*s)->slot_bytes();
    s->reset();
    auto store = ExpertStore::open(layout, path_, o);
    if (!store) return store.error();
    m->set_expert_store(std::move(*store));
    return m;
  }

 private:
  std::string path_;
};

ExpertStoreOptions small_queue() {
  ExpertStoreOptions o;
  o.queue_depth = 3;  // a small reserve (chunk + 2 + k slots): the tiny models have few experts
  o.prefetch_depth = 1;
  return o;
}

const Model& model_of(const Model& m) { return m; }
const Model& model_of(const Engine& e) { return e.model(); }

// A prompt, then greedy decoding: the logits of every step (of a model alone, or an engine's).
template <class Owner>
std::vector<std::vector<float>> run(const Owner& owner, int n_prompt, int n_gen) {
  Session s(owner, 128);
  const Model& m = model_of(owner);
  std::vector<int32_t> prompt;
  std::mt19937 rng(3);
  for (int i = 0; i < n_prompt; ++i) prompt.push_back(int32_t(rng() % uint32_t(m.hparams().n_vocab)));
  std::vector<std::vector<float>> out;
  auto l = s.eval(prompt);
  STRATA_CHECK(l.ok(), "eval failed");
  out.push_back(*l);
  for (int i = 0; i < n_gen; ++i) {
    const int32_t next = argmax(out.back());
    auto n = s.eval(std::span<const int32_t>(&next, 1));
    STRATA_CHECK(n.ok(), "eval failed");
    out.push_back(*n);
  }
  return out;
}

void expect_identical(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), b[i].size());
    EXPECT_EQ(std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)), 0) << "step " << i;
  }
}

int64_t total_experts(const Model& m) {
  int64_t n = 0;
  for (const LayerWeights& l : m.layers) n += l.is_moe() ? l.gate_exps.n_mat : 0;
  return n;
}

TEST(ExpertStore, StreamedEqualsInRam) {
  for (const char* shape : {"tiny", "tiny-deepseek2"}) {
    SCOPED_TRACE(shape);
    StreamedModel sm(shape);
    const auto ram = sm.in_ram();
    const auto want = run(*ram, 20, 24);
    // one slot too few is an error; the fewest accepted hold a fraction of the experts
    auto m = sm.streamed(-1, small_queue());
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.error().message.find("at least"), std::string::npos) << m.error().message;
    m = sm.streamed(0, small_queue());
    ASSERT_TRUE(m.ok()) << m.error().message;
    ASSERT_LT((*m)->expert_store()->n_slots(), total_experts(*ram));
    EXPECT_GT((*m)->model().resident_bytes, 0u);
    expect_identical(run(**m, 20, 24), want);
    const ExpertStoreStats st = (*m)->expert_store()->stats();
    EXPECT_GT(st.demand_reads, 0);
    EXPECT_GT(st.hits, 0);
    EXPECT_GT(st.prefetch_reads, 0);
    EXPECT_LT(st.hit_rate(), 1.0);
    ASSERT_EQ(st.predicted.size(), 1u);
    EXPECT_GT(st.predicted[0], 0);
    EXPECT_LE(st.predicted_right[0], st.predicted[0]);
    EXPECT_GT(st.bytes_read, 0u);
  }
}

// Three tiers at once (simulated VRAM + the RAM slots of the expert store + the file): a third of
// the experts get VRAM slots, promoted from the store's RAM slots; the rest are computed by the
// CPU from RAM or read from the file. Decode is bit-identical to the all-in-RAM model on every
// architecture, and each tier serves some uses.
TEST(ThreeTiers, SimulatedVramRamAndNvmeEqualTheAllInRamRun) {
  for (const char* shape : {"tiny", "tiny-deepseek2", "tiny-gpt-oss", "tiny-mixtral", "tiny-deepseek4", "tiny-deepseek41"}) {
    SCOPED_TRACE(shape);
    StreamedModel sm(shape);
    const auto ram = sm.in_ram();
    const auto want = run(*ram, 20, 24);
    auto m = sm.streamed(0, small_queue());
    ASSERT_TRUE(m.ok()) << m.error().message;
    Engine& engine = **m;
    const int64_t n_experts = total_experts(engine.model());
    ASSERT_LT(engine.expert_store()->n_slots(), n_experts);
    GpuTier::Options o{.vram_bytes = GpuTier::arena_bytes(engine.model(), int(n_experts / 3))};
    o.cache.max_promotions = 8;
    auto tier = GpuTier::create_simulated(engine.model(), o);
    ASSERT_TRUE(tier.ok()) << tier.error().message;
    engine.set_gpu_tier(std::move(*tier));
    prof::reset();
    prof::enable(true);
    expect_identical(run(engine, 20, 24), want);
    prof::enable(false);
    // each tier's link was busy: reads in flight, the device's kernels and its copies
    EXPECT_GT(prof::g_totals.link_ns[size_t(prof::Link::nvme_read)].load(), 0);
    EXPECT_GT(prof::g_totals.link_ns[size_t(prof::Link::gpu)].load(), 0);
    EXPECT_GT(prof::g_totals.link_ns[size_t(prof::Link::pcie_h2d)].load(), 0);
    EXPECT_GT(prof::g_totals.link_ns[size_t(prof::Link::cpu)].load(), 0);
    const GpuTier::Stats g = engine.gpu_tier()->stats();
    EXPECT_GT(g.promotions, 0u) << engine.gpu_tier()->summary();
    EXPECT_GT(g.gpu_uses, 0u) << engine.gpu_tier()->summary();
    EXPECT_EQ(g.ship_uses, 0u) << "streamed experts are not shipped";
    EXPECT_EQ(g.stalls, 0u);
    const ExpertStoreStats st = engine.expert_store()->stats();
    EXPECT_GT(st.demand_reads, 0);
    EXPECT_EQ(uint64_t(st.accesses), g.cpu_uses) << "the store serves exactly the CPU's uses";
    const Engine::TierStats ts = engine.tier_stats();
    EXPECT_EQ(ts.uses, g.gpu_uses + g.cpu_uses);
    EXPECT_EQ(ts.vram + ts.ram + ts.nvme, ts.uses);
    EXPECT_GT(ts.vram, 0u);
    EXPECT_GT(ts.ram, 0u);
    EXPECT_GT(ts.nvme, 0u);
    EXPECT_GT(ts.nvme_bytes, 0u);
    EXPECT_GT(ts.pcie_bytes, 0u);
    engine.expert_store()->drain();
    EXPECT_EQ(engine.expert_store()->slot_counts().other, 0) << "a RAM slot leaked (a promotion's pin)";
  }
}

// deepseek4 (a synthetic model of the fixture's shape, streamed through a cache smaller than its
// experts): decode is bit-identical to the all-in-RAM model, and the hash-routed layer's experts
// are read ahead of the layer, from the token ids alone: that layer never waits on a demand read.
TEST(ExpertStore, DeepSeek4HashLayersAreReadBeforeTheirLayer) {
  StreamedModel sm("tiny-deepseek4");
  const auto ram = sm.in_ram();
  ASSERT_EQ(ram->hparams().n_hash_layers, 1);
  const auto want = run(*ram, 20, 24);
  storage::FaultInjection slow;  // every read takes 5 ms: a prefetch has to be issued early to help
  slow.latency_us = 5000;
  ExpertStoreOptions o = small_queue();
  o.queue_depth = 12;  // four experts' reads in flight at once
  o.faults = &slow;
  auto m = sm.streamed(0, o);
  ASSERT_TRUE(m.ok()) << m.error().message;
  ASSERT_LT((*m)->expert_store()->n_slots(), total_experts(*ram));
  expect_identical(run(**m, 20, 24), want);
  // decode steps (a prompt needs more of the layer's experts than reads may be in flight)
  Session s(**m, 128);
  std::vector<int32_t> prompt = {5, 77, 301, 9, 64};
  auto l = s.eval(prompt);
  ASSERT_TRUE(l.ok());
  (*m)->expert_store()->reset_stats();
  for (int i = 0; i < 24; ++i) {
    const int32_t next = argmax(*l);
    l = s.eval(std::span<const int32_t>(&next, 1));
    ASSERT_TRUE(l.ok());
  }
  const ExpertStoreStats st = (*m)->expert_store()->stats();
  ASSERT_EQ(st.demand_reads_by_layer.size(), 3u);
  std::printf("  deepseek4 streamed decode: demand reads by layer %lld %lld %lld, prefetches used %lld\n",
              (long long)st.demand_reads_by_layer[0], (long long)st.demand_reads_by_layer[1],
              (long long)st.demand_reads_by_layer[2], (long long)st.prefetch_used);
  EXPECT_EQ(st.demand_reads_by_layer[0], 0) << "the hash-routed layer waited for a demand read";
  EXPECT_GT(st.demand_reads_by_layer[1] + st.demand_reads_by_layer[2], 0);  // the cache is too small for all
  EXPECT_GT(st.prefetch_used, 0);
}

TEST(ExpertStore, FaultyReaderStillExact) {
  StreamedModel sm("tiny");
  const auto want = run(*sm.in_ram(), 12, 12);
  for (bool uring : {true, false}) {
    SCOPED_TRACE(uring ? "io_uring" : "pread");
    storage::FaultInjection f;
    f.seed = 11;
    f.short_read_rate = 0.3;
    f.eagain_rate = 0.2;
    f.eio_rate = 0.1;
    f.latency_us = 300;
    ExpertStoreOptions o = small_queue();
    o.faults = &f;
    o.use_io_uring = uring;
    auto m = sm.streamed(0, o);
    ASSERT_TRUE(m.ok()) << m.error().message;
    expect_identical(run(**m, 12, 12), want);
  }
}

// Each fault on its own, through a decode: retries recover, the tokens stay exact.
TEST(ExpertStore, DecodeUnderEachFault) {
  StreamedModel sm("tiny");
  const auto want = run(*sm.in_ram(), 6, 6);
  struct Case {
    const char* name;
    storage::FaultInjection f;
  };
  std::vector<Case> cases(4);
  cases[0].name = "EIO on 30% of attempts";
  cases[0].f.eio_rate = 0.3;
  cases[1].name = "short reads on 60%";
  cases[1].f.short_read_rate = 0.6;
  cases[2].name = "EAGAIN storm: 90%";
  cases[2].f.eagain_rate = 0.9;
  cases[3].name = "20 ms per attempt (~100x a local read)";
  cases[3].f.latency_us = 20000;
  for (Case& c : cases) {
    SCOPED_TRACE(c.name);
    c.f.seed = 3;
    ExpertStoreOptions o = small_queue();
    o.faults = &c.f;
    auto m = sm.streamed(0, o);
    ASSERT_TRUE(m.ok()) << m.error().message;
    expect_identical(run(**m, 6, 6), want);
    ExpertStore& store = *(*m)->expert_store();
    store.drain();
    EXPECT_EQ(store.slot_counts().other, 0);
  }
}

// The model file cut short while the model runs: the experts past the cut are an error naming the
// file, never zeros or a crash; the session does not advance.
TEST(ExpertStore, FileTruncatedAfterStart) {
  StreamedModel sm("tiny");
  const std::string copy = sm.path() + ".cut";
  std::filesystem::copy_file(sm.path(), copy, std::filesystem::copy_options::overwrite_existing);
  struct Remove {
    std::string p;
    ~Remove() { std::remove(p.c_str()); }
  } remove_copy{copy};
  auto loaded = Model::load(copy, MappedFile::Mode::mmap, true, true);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  Engine engine(std::move(*loaded));
  const Model& model = engine.model();
  ExpertStoreOptions o = small_queue();
  o.cache_bytes = uint64_t(1) << 30;
  auto store = ExpertStore::open(expert_layout(model), copy, o);
  ASSERT_TRUE(store.ok()) << store.error().message;
  engine.set_expert_store(std::move(*store));
  // cut in the middle of the last layer's down stack (the resident weights are already in RAM)
  const Weight& down = model.layers.back().down_exps;
  const uint64_t cut = uint64_t(down.data - model.file().bytes_.data()) + down.mat_bytes() / 2;
  std::filesystem::resize_file(copy, cut);
  Session s(engine, 64);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 24; ++i) prompt.push_back(int32_t(i * 37 % model.hparams().n_vocab));
  auto l = s.eval(prompt);  // 24 tokens route to every expert of the last layer
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.error().message.find(copy), std::string::npos) << l.error().message;
  EXPECT_NE(l.error().message.find("end of file"), std::string::npos) << l.error().message;
  EXPECT_EQ(s.n_past(), 0);
  engine.expert_store()->drain();
  EXPECT_EQ(engine.expert_store()->slot_counts().other, 0);
}

TEST(ExpertStore, FailedReadIsAnErrorNamingFileAndOffset) {
  StreamedModel sm("tiny");
  const storage::FaultInjection f = sm.failing_gate(1);  // every read of layer 1's gate stack fails for good
  ExpertStoreOptions o = small_queue();
  o.faults = &f;
  auto m = sm.streamed(0, o);
  ASSERT_TRUE(m.ok()) << m.error().message;
  Session s(**m, 64);
  const std::vector<int32_t> prompt = {1, 2, 3, 4};
  auto l = s.eval(prompt);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.error().message.find(sm.path()), std::string::npos) << l.error().message;
  EXPECT_NE(l.error().message.find("offset"), std::string::npos) << l.error().message;
  EXPECT_EQ(s.n_past(), 0);  // nothing was taken as computed
}

// A prefetch that fails for an expert no layer then uses is nobody's error; the expert a layer does
// use reads fine.
TEST(ExpertStore, UnusedFailedPrefetchIsNotAnError) {
  StreamedModel sm("tiny");
  const storage::FaultInjection f = sm.failing_gate(1, 3);
  ExpertStoreOptions o = small_queue();
  o.faults = &f;
  auto m = sm.streamed(0, o);
  ASSERT_TRUE(m.ok()) << m.error().message;
  ExpertStore& store = *(*m)->expert_store();
  const std::vector<int32_t> predicted = {3};
  store.prefetch(1, 1, predicted);
  store.drain();
  const std::vector<int32_t> chosen = {5};
  store.begin_layer(1, chosen);
  const std::vector<ExpertView> views = store.acquire(1, chosen);
  EXPECT_TRUE(views[0].wait());
  store.release(views);
  EXPECT_TRUE(store.take_error().ok());
  // chosen after all: read on demand, fails, reported
  store.begin_layer(1, predicted);
  const std::vector<ExpertView> failed = store.acquire(1, predicted);
  EXPECT_FALSE(failed[0].wait());
  store.release(failed);
  const Status e = store.take_error();
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find(sm.path()), std::string::npos) << e.error().message;
}

// Many acquires with evictions and prefetches racing slow reads: every expert a caller gets holds
// exactly the bytes the all-in-RAM model has for it, until it is released.
TEST(ExpertStore, SlotsAreNeverReusedWhileInUse) {
  StreamedModel sm("tiny");
  const auto ram = sm.in_ram();
  storage::FaultInjection f;
  f.latency_us = 100;
  ExpertStoreOptions o = small_queue();
  o.faults = &f;
  auto m = sm.streamed(0, o);
  ASSERT_TRUE(m.ok()) << m.error().message;
  ExpertStore& store = *(*m)->expert_store();
  const HParams& hp = ram->hparams();
  std::mt19937 rng(5);
  for (int step = 0; step < 300; ++step) {
    const int layer = int(rng() % uint32_t(hp.n_layer));
    std::vector<int32_t> ids;
    for (int e = 0; e < hp.n_expert; ++e)
      if (rng() % 3 == 0) ids.push_back(e);
    if (ids.empty()) ids.push_back(0);
    if (layer + 1 < hp.n_layer) {
      const std::vector<int32_t> ahead = {int32_t(rng() % 8), int32_t(rng() % 8 + 8) % 8};
      if (ahead[0] != ahead[1]) store.prefetch(layer + 1, 1, ahead);
    }
    store.begin_layer(layer, ids);
    const std::vector<ExpertView> views = store.acquire(layer, ids);
    for (size_t i = 0; i < ids.size(); ++i) {
      ASSERT_TRUE(views[i].wait());
      const LayerWeights& l = ram->layers[size_t(layer)];
      const Weight want[3] = {l.gate_exps.slice(ids[i]), l.up_exps.slice(ids[i]), l.down_exps.slice(ids[i])};
      const Weight got[3] = {views[i].gate, views[i].up, views[i].down};
      for (int r = 0; r < 3; ++r) {
        ASSERT_EQ(got[r].interleaved, want[r].interleaved);
        ASSERT_EQ(std::memcmp(got[r].data, want[r].data, want[r].mat_bytes()), 0)
            << "step " << step << " layer " << layer << " expert " << ids[i] << " role " << r;
      }
    }
    store.release(views);
  }
  EXPECT_TRUE(store.take_error().ok());
  store.drain();
  const ExpertStore::SlotCounts c = store.slot_counts();
  EXPECT_EQ(c.other, 0) << "free " << c.free << " resident " << c.resident << " prefetched " << c.prefetched;
  EXPECT_EQ(c.free + c.resident + c.prefetched, store.n_slots());
  EXPECT_GT(c.resident, 0);
  const ExpertStoreStats st = store.stats();
  EXPECT_GT(st.prefetch_used, 0);  // the prefetched-then-used path (promote) ran
}

// budgets.ram below the model: the cache gets what the resident part, the KV cache and the stated
// overhead leave, and the store's arena stays inside it.
TEST(ExpertStore, BudgetAccounting) {
  // a model of Qwen3-30B-A3B's proportions: 1 GiB read by every token, 16 GiB of experts
  ModelSummary s;
  s.expert_bytes_total = uint64_t(16) << 30;
  s.n_bytes = s.expert_bytes_total + (uint64_t(1) << 30);
  const uint64_t fixed = s.n_bytes - s.expert_bytes_total, kv = uint64_t(400) << 20;
  const SystemMemory mem{uint64_t(64) << 30, uint64_t(60) << 30};
  Config c;
  c.ram_budget = uint64_t(8) << 30;
  auto b = check_budgets(c, s, kv, mem, 0);
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_EQ(b->expert_cache_bytes, *c.ram_budget - fixed - kv - kRamOverhead);
  EXPECT_EQ(b->load, MappedFile::Mode::mmap);
  // the whole model fits: read into RAM, nothing streamed
  c.ram_budget = uint64_t(18) << 30;
  b = check_budgets(c, s, kv, mem, 0);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->expert_cache_bytes, 0u);
  EXPECT_EQ(b->load, MappedFile::Mode::ram);
  // model.load = "mmap" asked for: mapped, not streamed
  c.ram_budget = uint64_t(8) << 30;
  c.load = MappedFile::Mode::mmap;
  b = check_budgets(c, s, kv, mem, 0);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->expert_cache_bytes, 0u);
  c.load = MappedFile::Mode::automatic;
  // nothing left for experts: an error naming the key
  c.ram_budget = fixed + kv + kRamOverhead / 2;
  b = check_budgets(c, s, kv, mem, 0);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().message.find("budgets.ram"), std::string::npos) << b.error().message;
  // "auto" on a machine with less memory available than the model: 80% of it
  c.ram_budget.reset();
  b = check_budgets(c, s, kv, SystemMemory{uint64_t(16) << 30, uint64_t(10) << 30}, 0);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->expert_cache_bytes, (uint64_t(10) << 30) / 10 * 8 - fixed - kv - kRamOverhead);

  // the store's arena stays inside the cache it is given
  StreamedModel sm("tiny");
  auto m = Model::load(sm.path(), MappedFile::Mode::mmap, true, true);
  ASSERT_TRUE(m.ok());
  auto header = GgufFile::open(sm.path(), MappedFile::Mode::mmap);
  ASSERT_TRUE(header.ok());
  auto tiny = summarize_model(*header);
  ASSERT_TRUE(tiny.ok());
  EXPECT_EQ((*m)->resident_bytes, tiny->n_bytes - tiny->expert_bytes_total);
  ExpertStoreOptions o = small_queue();
  o.cache_bytes = uint64_t(1) << 30;
  auto store = ExpertStore::open(expert_layout(**m), sm.path(), o);
  ASSERT_TRUE(store.ok()) << store.error().message;
  o.cache_bytes = (*store)->slot_bytes() * uint64_t(2 * (*store)->min_slots() + 1) / 2;  // and half a slot
  store->reset();
  store = ExpertStore::open(expert_layout(**m), sm.path(), o);
  ASSERT_TRUE(store.ok()) << store.error().message;
  EXPECT_LE((*store)->arena_bytes(), o.cache_bytes);
  EXPECT_GT((*store)->arena_bytes() + (*store)->slot_bytes(), o.cache_bytes);
}

}  // namespace
}  // namespace strata
