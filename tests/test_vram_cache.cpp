// The simulated device and the elastic VRAM cache of hot experts (issue #7): budgets and their
// errors, the KV cache taking room from the experts and giving it back, hot experts found online
// with a bounded number of promotions and no thrash, no promotion copy overlapping a kernel that
// reads its slot, and every resident slot holding its expert's bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "gpu/sim_device.h"
#include "gpu/vram_cache.h"

namespace strata::gpu {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

TEST(SimDevice, BudgetCopiesAndTheOverlapLog) {
  SimDevice dev(10 * kMiB, 25.0);
  auto a = dev.alloc(6 * kMiB);
  ASSERT_TRUE(a.ok());
  auto b = dev.alloc(6 * kMiB);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().message.find("6.0 MiB asked for"), std::string::npos) << b.error().message;
  const int copy = dev.new_stream(), compute = dev.new_stream();
  std::vector<uint8_t> host(6 * kMiB, 7);
  dev.copy_h2d(copy, *a, 0, host.data(), host.size());
  EXPECT_EQ(a->data[123], 7);
  EXPECT_NEAR(dev.record(copy), double(6 * kMiB) / 25e9, 1e-12);
  // a kernel reading the buffer while the copy runs: the log shows it
  const int reads[] = {a->id};
  dev.launch(compute, reads, 1e-4, nullptr);
  ASSERT_EQ(dev.overlaps().size(), 1u);
  // one that waits for the copy does not overlap it
  SimDevice dev2(10 * kMiB, 25.0);
  auto c = dev2.alloc(kMiB);
  ASSERT_TRUE(c.ok());
  const int s1 = dev2.new_stream(), s2 = dev2.new_stream();
  dev2.copy_h2d(s1, *c, 0, host.data(), kMiB);
  dev2.wait(s2, dev2.record(s1));
  const int reads2[] = {c->id};
  dev2.launch(s2, reads2, 1e-4, nullptr);
  EXPECT_TRUE(dev2.overlaps().empty());
  dev.free(*a);
  EXPECT_EQ(dev.used(), 0u);
}

TEST(VramCache, BudgetThatCannotHoldTheFixedPartSaysHowMuchIsNeeded) {
  SimDevice dev(100 * kMiB, 25.0);
  auto c = VramExpertCache::create(dev, 90 * kMiB, 20 * kMiB, kMiB, 2, 8);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find("110.0 MiB"), std::string::npos) << c.error().message;
  EXPECT_EQ(dev.used(), 0u);
  auto ok = VramExpertCache::create(dev, 50 * kMiB, 10 * kMiB, 4 * kMiB, 2, 8);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)->n_slots(), 10);  // the 40 MiB left, in slots of 4
}

// Routing of `steps` steps over n_layer x n_expert with top-k per token drawn from a Zipf-like
// popularity (per layer a different order), as real MoE routing is skewed.
struct SkewedRouting {
  int n_layer, n_expert, k;
  std::mt19937 rng{5};
  std::vector<std::vector<int>> order;  // [layer] experts by popularity
  std::vector<double> cdf;
  SkewedRouting(int layers, int experts, int top_k) : n_layer(layers), n_expert(experts), k(top_k) {
    for (int l = 0; l < layers; ++l) {
      std::vector<int> o(static_cast<size_t>(experts));
      for (int e = 0; e < experts; ++e) o[size_t(e)] = e;
      std::shuffle(o.begin(), o.end(), rng);
      order.push_back(o);
    }
    double sum = 0;
    for (int r = 0; r < experts; ++r) cdf.push_back(sum += 1.0 / std::pow(r + 1, 1.2));
    for (double& c : cdf) c /= sum;
  }
  std::vector<int32_t> token(int layer) {
    std::vector<int32_t> ids;
    while (int(ids.size()) < k) {
      const double u = std::uniform_real_distribution<double>(0, 1)(rng);
      const int r = int(std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
      const int e = order[size_t(layer)][size_t(std::min(r, n_expert - 1))];
      if (std::find(ids.begin(), ids.end(), e) == ids.end()) ids.push_back(e);
    }
    return ids;
  }
};

// Host copies of every expert: slot_bytes bytes tagged with (layer, expert).
struct HostExperts {
  uint64_t slot_bytes;
  int n_expert;
  std::vector<std::vector<uint8_t>> bytes;
  HostExperts(int n_layer, int experts, uint64_t sb) : slot_bytes(sb), n_expert(experts) {
    for (int i = 0; i < n_layer * experts; ++i) {
      std::vector<uint8_t> b(static_cast<size_t>(sb));
      for (uint64_t j = 0; j < sb; ++j) b[j] = uint8_t(i * 31 + int(j) * 7);
      bytes.push_back(std::move(b));
    }
  }
  const uint8_t* get(int layer, int expert) const { return bytes[size_t(layer * n_expert + expert)].data(); }
  // the cache's HostBytes: one piece
  std::vector<std::span<const uint8_t>> pieces(int layer, int expert) const {
    return {std::span<const uint8_t>(get(layer, expert), slot_bytes)};
  }
};

// A decode loop on the simulated device: per step and layer, the routed experts that are ready
// run on the GPU stream (reading their slot), the rest on the CPU (host time advances); then the
// cache promotes. Returns the fraction of expert uses served from VRAM over the last half.
double run_steps(VramExpertCache& c, SimDevice& dev, SkewedRouting& r, const HostExperts& host, int steps,
                 int& max_promotions_in_a_step) {
  const int gpu = dev.new_stream();
  int64_t served = 0, uses = 0;
  for (int step = 0; step < steps; ++step) {
    for (int l = 0; l < r.n_layer; ++l) {
      const std::vector<int32_t> ids = r.token(l);
      c.observe(l, ids);
      for (int32_t e : ids) {
        const int slot = c.ready_slot(l, e, gpu);
        if (step >= steps / 2) ++uses;
        if (slot >= 0) {
          if (step >= steps / 2) ++served;
          c.run(gpu, slot, 100e-6, nullptr);  // the GPU queue runs behind the host
        } else {
          dev.host_advance(5e-6);  // the CPU computes it
        }
      }
      // the layer's outputs are summed: the GPU's share waits for the CPU's. The host does not wait
      // for the GPU here (its kernels may still be queued when the cache promotes): the ordering
      // of copies after the kernels that read a slot must come from the cache's events.
      dev.wait(gpu, dev.host_time());
    }
    max_promotions_in_a_step = std::max(max_promotions_in_a_step, c.end_step([&](int l, int e) { return host.pieces(l, e); }));
  }
  return uses > 0 ? double(served) / double(uses) : 0;
}

TEST(VramCache, HotExpertsArePromotedWithoutOverlapOrThrash) {
  const int L = 4, X = 32, K = 4;
  const uint64_t sb = 64 * 1024;
  SimDevice dev(2 * kMiB + 24 * sb, 25.0);  // 24 slots for 128 experts
  auto c = VramExpertCache::create(dev, kMiB, kMiB, sb, L, X, {.decay = 0.9, .max_promotions = 4, .hysteresis = 0.5});
  ASSERT_TRUE(c.ok()) << c.error().message;
  ASSERT_EQ((*c)->n_slots(), 24);
  SkewedRouting routing(L, X, K);
  HostExperts host(L, X, sb);
  int most = 0;
  const double hit = run_steps(**c, dev, routing, host, 400, most);
  EXPECT_LE(most, 4);
  EXPECT_EQ((*c)->n_resident(), 24);
  EXPECT_EQ((*c)->stalls(), 0u);  // no kernel ever waited for a promotion's copy
  // 24 of 128 slots (19%) serve far more than 19% of the uses under skewed routing
  EXPECT_GT(hit, 0.45) << "hit rate " << hit;
  // no copy into a slot overlapped a kernel reading it
  const std::vector<std::string> bad = dev.overlaps();
  EXPECT_TRUE(bad.empty()) << bad.front();
  // every resident slot holds its expert's bytes
  for (int l = 0; l < L; ++l)
    for (int e = 0; e < X; ++e) {
      if (!(*c)->resident(l, e)) continue;
      const int gpu_probe = dev.new_stream();
      dev.wait(gpu_probe, 1e9);  // far in the future: every copy has landed
      const int slot = (*c)->ready_slot(l, e, gpu_probe);
      ASSERT_GE(slot, 0);
      EXPECT_TRUE(std::equal(host.get(l, e), host.get(l, e) + sb, (*c)->slot_data(slot))) << l << "/" << e;
    }
  // hysteresis: with the popularity steady, promotions settle (the last 200 steps promote little)
  const uint64_t before = (*c)->promotions();
  run_steps(**c, dev, routing, host, 200, most);
  EXPECT_LT((*c)->promotions() - before, 200u) << "thrash: " << (*c)->promotions() - before << " promotions";
  EXPECT_TRUE(dev.overlaps().empty());
}

// A promotion never stalls compute: until its copy has landed, the expert is not handed out (it
// runs on the CPU), and then it is.
TEST(VramCache, APromotedExpertServesOnlyOnceItsCopyHasLanded) {
  const uint64_t sb = 4 * kMiB;
  SimDevice dev(8 * sb, 16.0);  // a 4 MiB copy takes 262 us
  auto made = VramExpertCache::create(dev, 0, 0, sb, 1, 4);
  ASSERT_TRUE(made.ok());
  VramExpertCache& c = **made;
  HostExperts host(1, 4, sb);
  c.observe(0, std::vector<int32_t>{2});
  ASSERT_EQ(c.end_step([&](int l, int e) { return host.pieces(l, e); }), 1);
  const int gpu = dev.new_stream();
  EXPECT_TRUE(c.resident(0, 2));
  EXPECT_EQ(c.ready_slot(0, 2, gpu), -1);
  dev.host_advance(double(sb) / 16e9 * 0.99);
  EXPECT_EQ(c.ready_slot(0, 2, gpu), -1);
  dev.host_advance(double(sb) / 16e9 * 0.02);
  const int slot = c.ready_slot(0, 2, gpu);
  ASSERT_GE(slot, 0);
  c.run(gpu, slot, 1e-4, nullptr);
  EXPECT_EQ(c.stalls(), 0u);
  EXPECT_TRUE(dev.overlaps().empty());
}

TEST(VramCache, KvCacheTakesRoomFromTheColdestExpertsAndGivesItBack) {
  const int L = 2, X = 16;
  const uint64_t sb = 64 * 1024;
  SimDevice dev(kMiB + 16 * sb, 25.0);
  auto made = VramExpertCache::create(dev, kMiB, 0, sb, L, X, {.decay = 1.0, .max_promotions = 16, .hysteresis = 0});
  ASSERT_TRUE(made.ok());
  VramExpertCache& c = **made;
  HostExperts host(L, X, sb);
  // heat: expert e of layer 0 used e + 1 times; promote all 16 hottest of the 32
  for (int e = 0; e < X; ++e)
    for (int n = 0; n <= e; ++n) c.observe(0, std::vector<int32_t>{e});
  for (int e = 0; e < X; ++e) c.observe(1, std::vector<int32_t>{e});
  c.end_step([&](int l, int e) { return host.pieces(l, e); });
  ASSERT_EQ(c.n_resident(), 16);
  // the KV cache grows by 5 slots' worth: the 5 coldest residents go, the hottest stay
  ASSERT_TRUE(c.set_kv_bytes(5 * sb - 100).ok());
  EXPECT_EQ(c.n_slots(), 11);
  EXPECT_EQ(c.n_resident(), 11);
  EXPECT_TRUE(c.resident(0, X - 1));
  EXPECT_EQ(c.evictions(), 5u);
  // more than the arena can ever give: an error, and nothing changes
  auto too_much = c.set_kv_bytes(17 * sb);
  ASSERT_FALSE(too_much.ok());
  EXPECT_NE(too_much.error().message.find("KV cache needs"), std::string::npos) << too_much.error().message;
  EXPECT_EQ(c.n_slots(), 11);
  // the KV cache shrinks: the room is slots again, refilled by the next promotions
  ASSERT_TRUE(c.set_kv_bytes(sb).ok());
  EXPECT_EQ(c.n_slots(), 15);
  c.end_step([&](int l, int e) { return host.pieces(l, e); });
  EXPECT_EQ(c.n_resident(), 15);
  EXPECT_TRUE(dev.overlaps().empty());
}

}  // namespace
}  // namespace strata::gpu
