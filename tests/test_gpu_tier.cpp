// The GPU tier on the simulated device, wired into the forward pass (engine/gpu_tier.h): experts the
// VRAM cache holds are computed from their slot, and the logits equal the CPU-only path bit for
// bit on every architecture; the cache fills from the routing; the KV cache of a growing context
// takes slots and gives them back when the session ends; a budget too small is a clear error.
#include <gtest/gtest.h>

#include <random>

#include "engine/engine.h"
#include "engine/session.h"
#include "engine/gpu_tier.h"
#include "test_support.h"

namespace strata {
namespace {

class GpuTierArch : public ::testing::TestWithParam<const char*> {};

TEST_P(GpuTierArch, LogitsEqualTheCpuOnlyPathBitForBit) {
  std::vector<uint8_t> bytes;
  auto loaded = test::synth_q8_model(GetParam(), bytes);
  ASSERT_TRUE(loaded);
  Engine engine(std::move(loaded));
  Model* m = &engine.model();
  const std::vector<int32_t> ids = test::random_ids(48, 3, m->hparams().n_vocab);
  auto decode = [&](std::vector<float>& all) {
    Session s(engine, 64);
    ASSERT_TRUE(s.eval(std::span<const int32_t>(ids.data(), 8)));
    for (size_t i = 8; i < ids.size(); ++i) {
      auto l = s.eval(std::span<const int32_t>(&ids[i], 1));
      ASSERT_TRUE(l.ok());
      all.insert(all.end(), l->begin(), l->end());
    }
  };
  std::vector<float> cpu, gpu;
  decode(cpu);
  const int n_moe_experts = int(std::count_if(m->layers.begin(), m->layers.end(), [](const LayerWeights& l) {
                              return l.is_moe();
                            })) * m->hparams().n_expert;
  auto tier = GpuTier::create_simulated(*m, {.vram_bytes = GpuTier::arena_bytes(*m, n_moe_experts / 3)});
  ASSERT_TRUE(tier.ok()) << tier.error().message;
  engine.set_gpu_tier(std::move(*tier));
  decode(gpu);
  EXPECT_EQ(gpu, cpu);
  const GpuTier::Stats st = engine.gpu_tier()->stats();
  EXPECT_GT(st.gpu_uses, 0u) << engine.gpu_tier()->summary();
  EXPECT_GT(st.cpu_uses, 0u);
  EXPECT_GT(st.promotions, 0u);
  EXPECT_EQ(st.stalls, 0u);
  EXPECT_TRUE(engine.gpu_tier()->device().overlaps().empty());
  engine.set_gpu_tier(nullptr);
}

INSTANTIATE_TEST_SUITE_P(Archs, GpuTierArch,
                         ::testing::Values("tiny", "tiny-deepseek2", "tiny-gpt-oss", "tiny-mixtral", "tiny-deepseek4",
                                           "tiny-deepseek41"));

// A session's growing KV cache takes expert slots; when the session ends they come back.
TEST(GpuTier, KvCacheOfAGrowingContextTakesSlotsAndGivesThemBack) {
  std::vector<uint8_t> bytes;
  auto loaded = test::synth_q8_model("tiny", bytes);
  ASSERT_TRUE(loaded);
  Engine engine(std::move(loaded));
  Model* m = &engine.model();
  auto tier = GpuTier::create_simulated(*m, {.vram_bytes = GpuTier::arena_bytes(*m, 12)});
  ASSERT_TRUE(tier.ok());
  engine.set_gpu_tier(std::move(*tier));
  GpuTier& t = *engine.gpu_tier();
  ASSERT_EQ(t.stats().slots, 12);
  const uint64_t per_token = kv_bytes_per_token(m->hparams(), KvType::f16);
  const int n = int(6 * t.stats().slot_bytes / per_token);  // about 6 slots' worth of KV
  {
    Session s(engine, n + 8);
    const std::vector<int32_t> ids = test::random_ids(n, 7, m->hparams().n_vocab);
    for (int i = 0; i < n; i += 64) {
      const int len = std::min(64, n - i);
      ASSERT_TRUE(s.eval(std::span<const int32_t>(ids.data() + i, size_t(len))));
    }
    EXPECT_EQ(t.stats().kv_bytes, per_token * uint64_t(n));
    EXPECT_LE(t.stats().slots, 6);
    EXPECT_GE(t.stats().slots, 5);
  }
  EXPECT_EQ(t.stats().kv_bytes, 0u);
  EXPECT_EQ(t.stats().slots, 12);
  engine.set_gpu_tier(nullptr);
}

TEST(GpuTier, ABudgetThatCannotHoldTheFixedPartIsAnError) {
  std::vector<uint8_t> bytes;
  auto loaded = test::synth_q8_model("tiny", bytes);
  ASSERT_TRUE(loaded);
  Engine engine(std::move(loaded));
  Model* m = &engine.model();
  auto tier = GpuTier::create_simulated(*m, {.vram_bytes = GpuTier::arena_bytes(*m, 0) - 1});
  ASSERT_FALSE(tier.ok());
  EXPECT_NE(tier.error().message.find("cannot hold what every token needs"), std::string::npos)
      << tier.error().message;
}

// With the CPU's rates known, a prefill's busy experts that are not resident ship to the GPU for
// the step (and the logits still equal the CPU-only path); one-token decode steps ship nothing.
TEST(GpuTier, PrefillShipsBusyExpertsDecodeDoesNot) {
  std::vector<uint8_t> bytes;
  auto loaded = test::synth_q8_model("tiny", bytes);
  ASSERT_TRUE(loaded);
  Engine engine(std::move(loaded));
  Model* m = &engine.model();
  const std::vector<int32_t> ids = test::random_ids(72, 5, m->hparams().n_vocab);
  auto run = [&](std::vector<float>& all) {
    Session s(engine, 96);
    auto first = s.eval(std::span<const int32_t>(ids.data(), 64));
    ASSERT_TRUE(first.ok());
    all.insert(all.end(), first->begin(), first->end());
    if (engine.gpu_tier()) {
      EXPECT_GT(engine.gpu_tier()->stats().ship_uses, 0u) << engine.gpu_tier()->summary();
      EXPECT_GT(engine.gpu_tier()->stats().model_copy_s, 0.0);
    }
    const uint64_t shipped = engine.gpu_tier() ? engine.gpu_tier()->stats().ship_uses : 0;
    for (size_t i = 64; i < ids.size(); ++i) {
      auto l = s.eval(std::span<const int32_t>(&ids[i], 1));
      ASSERT_TRUE(l.ok());
      all.insert(all.end(), l->begin(), l->end());
    }
    if (engine.gpu_tier()) {
      EXPECT_EQ(engine.gpu_tier()->stats().ship_uses, shipped) << "a decode step shipped an expert";
    }
  };
  std::vector<float> cpu, gpu;
  run(cpu);
  GpuTier::Options o{.vram_bytes = GpuTier::arena_bytes(*m, 4)};
  o.costs.cpu_gbps = 40;
  o.costs.cpu_ops = 300e9;
  auto tier = GpuTier::create_simulated(*m, o);
  ASSERT_TRUE(tier.ok()) << tier.error().message;
  engine.set_gpu_tier(std::move(*tier));
  run(gpu);
  EXPECT_EQ(gpu, cpu);
  EXPECT_NE(engine.gpu_tier()->summary().find("shipped"), std::string::npos);
  engine.set_gpu_tier(nullptr);
}

// Warm start: the counts one run saves fill a new tier's slots at once with that run's hottest
// experts, so its first steps serve from VRAM where a cold tier cannot; files of another shape or
// not strata's are clear errors.
TEST(GpuTier, WarmStartFromSavedRoutingCounts) {
  std::vector<uint8_t> bytes;
  auto loaded = test::synth_q8_model("tiny", bytes);
  ASSERT_TRUE(loaded);
  Engine engine(std::move(loaded));
  Model* m = &engine.model();
  const auto dir = test::scratch_dir("gpu-heat");
  const std::string path = (dir / "heat.txt").string();
  const std::vector<int32_t> ids = test::random_ids(40, 9, m->hparams().n_vocab);
  auto decode = [&](int n) {
    Session s(engine, 64);
    for (int i = 0; i < n; ++i) ASSERT_TRUE(s.eval(std::span<const int32_t>(&ids[size_t(i)], 1)).ok());
  };
  const GpuTier::Options o{.vram_bytes = GpuTier::arena_bytes(*m, 6)};
  std::vector<double> saved;
  {
    auto tier = GpuTier::create_simulated(*m, o);
    ASSERT_TRUE(tier.ok());
    engine.set_gpu_tier(std::move(*tier));
    decode(40);
    ASSERT_TRUE(engine.gpu_tier()->save_heat(path).ok());
    engine.set_gpu_tier(nullptr);
  }
  auto first_steps_from_vram = [&](bool warm) -> uint64_t {
    auto tier = GpuTier::create_simulated(*m, o);
    EXPECT_TRUE(tier.ok());
    engine.set_gpu_tier(std::move(*tier));
    if (warm) {
      auto n = engine.gpu_tier()->load_heat(path);
      EXPECT_TRUE(n.ok()) << (n.ok() ? "" : n.error().message);
      EXPECT_EQ(n.ok() ? *n : -1, 6);  // every slot filled at once
      EXPECT_EQ(engine.gpu_tier()->stats().resident, 6);
    }
    decode(2);
    const uint64_t uses = engine.gpu_tier()->stats().gpu_uses;
    engine.set_gpu_tier(nullptr);
    return uses;
  };
  const uint64_t cold = first_steps_from_vram(false), warm = first_steps_from_vram(true);
  EXPECT_GT(warm, cold) << "warm " << warm << ", cold " << cold;

  // errors name the problem; nothing is half-loaded
  auto tier = GpuTier::create_simulated(*m, o);
  ASSERT_TRUE(tier.ok());
  auto expect_error = [&](const std::string& text, const char* what) {
    test::write_file(dir / "bad.txt", std::vector<uint8_t>(text.begin(), text.end()));
    auto r = (*tier)->load_heat((dir / "bad.txt").string());
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.error().message.find(what), std::string::npos) << r.error().message;
    EXPECT_EQ((*tier)->stats().resident, 0);
  };
  expect_error("hello\n", "not a routing-statistics file");
  expect_error("strata-expert-heat 1\nlayers 99 experts 8\n", "this model has");
  expect_error("strata-expert-heat 1\nlayers " + std::to_string(m->hparams().n_layer) + " experts " +
                   std::to_string(m->hparams().n_expert) + "\n1 2 3\n",
               "missing");
  auto missing = (*tier)->load_heat((dir / "no-such-file").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("cannot read"), std::string::npos);
}

}  // namespace
}  // namespace strata
