// The one interface the forward passes reach the routed experts through (model/experts.h): every
// architecture calls RoutedExperts::run once per MoE main layer with the router's (or the
// override's) choices, asks for the look-ahead only in small batches, and keeps the nextn layer's
// experts to itself; an implementation that computes them as moe_ffn does gives the resident
// logits bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "model/blocks.h"
#include "model/forward.h"
#include "test_support.h"

namespace strata {
namespace {

// Computes what ResidentExperts computes, and records what the forward pass asked.
class RecordingExperts final : public RoutedExperts {
 public:
  explicit RecordingExperts(int depth) : depth_(depth) {}
  int lookahead_depth() const override { return depth_; }
  void prefetch(int layer, int distance, std::span<const int32_t> experts) override {
    prefetches.push_back({layer, distance, std::vector<int32_t>(experts.begin(), experts.end())});
  }
  void run(const cpu::Matmul& mm, const LayerWeights& l, int il, const Routing& r, const float* h, int64_t n_tok,
           int64_t n_embd, const GluParams& glu, float* out) override {
    runs.push_back({il, r.ids});
    moe_ffn(mm, l, r, h, n_tok, n_embd, out, glu);
  }
  struct Prefetch {
    int layer, distance;
    std::vector<int32_t> experts;
  };
  std::vector<Prefetch> prefetches;
  std::vector<std::pair<int, std::vector<int32_t>>> runs;

 private:
  int depth_;
};

// Expert (t + layer + j) % n_expert for choice j of token t: distinct, and never the router's
// pattern by accident for long.
class FixedRouting final : public RoutingOverride {
 public:
  explicit FixedRouting(int n_expert) : n_expert_(n_expert) {}
  void choose(int il, int64_t n_tok, Routing& r) override {
    const std::vector<int32_t> ids = peek(il, n_tok);
    std::copy(ids.begin(), ids.end(), r.ids.begin());
    pos_[il] += n_tok;
  }
  std::vector<int32_t> peek(int il, int64_t n_tok) const override {
    const int k = k_;
    std::vector<int32_t> ids;
    const auto at = pos_.find(il);
    const int64_t p0 = at == pos_.end() ? 0 : at->second;
    for (int64_t t = 0; t < n_tok; ++t)
      for (int j = 0; j < k; ++j) ids.push_back(int32_t((p0 + t + il + j) % n_expert_));
    return ids;
  }
  int k_ = 0;

 private:
  int n_expert_;
  std::map<int, int64_t> pos_;
};

// One forward pass of `ids` at position pos0 in `cache`, on `ex`; the last token's logits.
std::vector<float> forward_last(const Model& m, const Exec& ex, KvCache& cache, std::span<const int32_t> ids,
                                int64_t pos0) {
  const SeqSpan seq{&cache, pos0, int64_t(ids.size())};
  std::vector<float> logits(size_t(m.hparams().n_vocab));
  forward(m, ex, std::span<const SeqSpan>(&seq, 1), ids.data(), false, logits.data());
  return logits;
}

class RoutedExpertsArch : public ::testing::TestWithParam<const char*> {};

TEST_P(RoutedExpertsArch, OneRunPerMoeLayerAndTheResidentLogits) {
  std::vector<uint8_t> bytes;
  auto m = test::synth_q8_model(GetParam(), bytes);
  ASSERT_TRUE(m);
  const HParams& hp = m->hparams();
  const int n_moe = int(std::count_if(m->layers.begin(), m->layers.end(), [](const LayerWeights& l) { return l.is_moe(); }));
  ASSERT_GT(n_moe, 0);
  const std::vector<int32_t> ids = test::random_ids(12, 5, hp.n_vocab);
  const CpuBackend be(cpu::MatmulPath::quantized);
  KvCache want_cache, got_cache;
  init_cache(*m, 32, want_cache, KvType::f16);
  init_cache(*m, 32, got_cache, KvType::f16);
  RecordingExperts rec(/*depth=*/1);
  // a prefill of 10 tokens (no look-ahead: above kPrefetchMaxTokens), then two one-token steps
  for (const auto& [p0, n] : std::vector<std::pair<int64_t, int64_t>>{{0, 10}, {10, 1}, {11, 1}}) {
    const std::span<const int32_t> part(ids.data() + p0, size_t(n));
    const size_t runs_before = rec.runs.size(), prefetches_before = rec.prefetches.size();
    const std::vector<float> want = forward_last(*m, Exec(be), want_cache, part, p0);
    const std::vector<float> got = forward_last(*m, Exec(be, rec), got_cache, part, p0);
    EXPECT_EQ(got, want) << "tokens from " << p0;
    // one run per MoE layer, in layer order, with k ids per token
    ASSERT_EQ(rec.runs.size() - runs_before, size_t(n_moe));
    int last = -1;
    for (size_t i = runs_before; i < rec.runs.size(); ++i) {
      EXPECT_GT(rec.runs[i].first, last);
      EXPECT_LT(rec.runs[i].first, hp.n_layer);
      EXPECT_EQ(rec.runs[i].second.size(), size_t(n * hp.n_expert_used));
      last = rec.runs[i].first;
    }
    // look-ahead: none for the prefill; in decode, distance 1, for MoE layers 1.., best first and
    // distinct (hash-routed layers: before the first layer, exactly)
    if (n > kPrefetchMaxTokens) {
      for (size_t i = prefetches_before; i < rec.prefetches.size(); ++i)
        EXPECT_LT(rec.prefetches[i].layer, hp.n_hash_layers) << "a routed look-ahead in a prefill";
    } else {
      EXPECT_GT(rec.prefetches.size(), prefetches_before);
    }
    for (size_t i = prefetches_before; i < rec.prefetches.size(); ++i) {
      const RecordingExperts::Prefetch& p = rec.prefetches[i];
      EXPECT_EQ(p.distance, 1);
      std::vector<int32_t> sorted = p.experts;
      std::sort(sorted.begin(), sorted.end());
      EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << "repeated experts";
      EXPECT_TRUE(m->layers[size_t(p.layer)].is_moe());
    }
  }
}

TEST_P(RoutedExpertsArch, TheOverrideDecidesAndItsPeekIsTheLookAhead) {
  std::vector<uint8_t> bytes;
  auto m = test::synth_q8_model(GetParam(), bytes);
  ASSERT_TRUE(m);
  const HParams& hp = m->hparams();
  const std::vector<int32_t> ids = test::random_ids(3, 9, hp.n_vocab);
  const CpuBackend be(cpu::MatmulPath::quantized);
  KvCache cache;
  init_cache(*m, 8, cache, KvType::f16);
  RecordingExperts rec(/*depth=*/1);
  FixedRouting fixed(hp.n_expert);
  fixed.k_ = hp.n_expert_used;
  FixedRouting oracle(hp.n_expert);  // the same choices, replayed to check against
  oracle.k_ = hp.n_expert_used;
  for (int64_t p = 0; p < int64_t(ids.size()); ++p) {
    const size_t runs_before = rec.runs.size(), prefetches_before = rec.prefetches.size();
    forward_last(*m, Exec(be, rec, &fixed), cache, std::span<const int32_t>(&ids[size_t(p)], 1), p);
    for (size_t i = prefetches_before; i < rec.prefetches.size(); ++i) {
      const RecordingExperts::Prefetch& pf = rec.prefetches[i];
      // what the override will choose for that layer's token, as its peek gives it
      EXPECT_EQ(pf.experts, oracle.peek(pf.layer, 1)) << "layer " << pf.layer;
    }
    for (size_t i = runs_before; i < rec.runs.size(); ++i) {
      const int il = rec.runs[i].first;
      Routing r{.k = hp.n_expert_used, .ids = std::vector<int32_t>(size_t(hp.n_expert_used)), .weights = {}};
      oracle.choose(il, 1, r);
      EXPECT_EQ(rec.runs[i].second, r.ids) << "layer " << il;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, RoutedExpertsArch,
                         ::testing::Values("tiny", "tiny-deepseek2", "tiny-gpt-oss", "tiny-mixtral", "tiny-deepseek4",
                                           "tiny-deepseek41"));

// The nextn (MTP) layer's experts are its own: its block computes them from its weights, never
// through the tiers, and no override replaces its routing; a main layer's block does both.
TEST(RoutedExperts, TheNextnLayerKeepsItsExperts) {
  std::vector<uint8_t> bytes;
  auto m = test::synth_q8_model("tiny", bytes, /*mtp_layers=*/1);
  ASSERT_TRUE(m);
  ASSERT_NE(m->mtp, nullptr) << m->mtp_error;
  const HParams& hp = m->hparams();
  const CpuBackend be(cpu::MatmulPath::quantized);
  KvCache cache;
  init_mtp_cache(*m, 8, cache, KvType::f16);
  const int64_t E = hp.n_embd;
  std::vector<float> x(static_cast<size_t>(E), 0.5f), h(static_cast<size_t>(E)), y(static_cast<size_t>(E));
  const SeqSpan seq{&cache, 0, 1};
  RecordingExperts rec(/*depth=*/1);
  FixedRouting fixed(hp.n_expert);
  fixed.k_ = hp.n_expert_used;
  gqa_moe_block(*m, Exec(be, rec, &fixed), std::span<const SeqSpan>(&seq, 1), m->mtp->il, m->mtp->block, x.data(), 1,
                h.data(), y.data());
  EXPECT_TRUE(rec.runs.empty()) << "the nextn layer's experts went through the tiers";
  EXPECT_TRUE(rec.prefetches.empty());
  FixedRouting fresh(hp.n_expert);
  fresh.k_ = hp.n_expert_used;
  EXPECT_EQ(fixed.peek(m->mtp->il, 1), fresh.peek(m->mtp->il, 1)) << "the override chose for the nextn layer";
  // a main layer through the same block: one run, with the override's choices
  std::vector<float> x0(size_t(E), 0.5f);
  init_cache(*m, 8, cache, KvType::f16);
  gqa_moe_block(*m, Exec(be, rec, &fixed), std::span<const SeqSpan>(&seq, 1), 0, m->layers[0], x0.data(), 1, h.data(),
                y.data());
  ASSERT_EQ(rec.runs.size(), 1u);
  EXPECT_EQ(rec.runs[0].first, 0);
  FixedRouting oracle(hp.n_expert);
  oracle.k_ = hp.n_expert_used;
  EXPECT_EQ(rec.runs[0].second, oracle.peek(0, 1));
}

}  // namespace
}  // namespace strata
