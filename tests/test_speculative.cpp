// Speculative decoding: the n-gram drafter, the accept/reject rule (the output keeps the sampler's
// distribution: a chi-square test), exact rewinding of every cache kind (deepseek4's compressor
// rings included), greedy output identical to plain decoding on every architecture (synthetic
// models always, the llama.cpp fixtures when present), and the controller turning a drafter that
// does not pay down to k = 0.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "cpu/kernels.h"
#include "engine/generate.h"
#include "engine/speculative.h"
#include "model/synth.h"
#include "test_support.h"

namespace strata {
namespace {

TEST(Ngram, ProposesWhatFollowedTheLatestOccurrence) {
  NgramDrafter d(2, 4);
  const std::vector<TokenId> h = {5, 1, 2, 3, 9, 1, 2, 7, 8, 1, 2};
  // suffix {1, 2}: latest earlier occurrence at 5 (followed by 7, 8, 1)
  EXPECT_EQ(d.draft(h, 3), (std::vector<TokenId>{7, 8, 1}));
  // a longer suffix wins over a later shorter one
  const std::vector<TokenId> h2 = {4, 5, 6, 7, 0, 5, 6, 8, 4, 5, 6};
  EXPECT_EQ(d.draft(h2, 2), (std::vector<TokenId>{7, 0}));  // {4, 5, 6} at 0 beats {5, 6} at 5
  EXPECT_EQ(d.draft(h, 0), std::vector<TokenId>{});
  EXPECT_EQ(d.draft(std::vector<TokenId>{1, 2, 3, 4}, 4), std::vector<TokenId>{});  // nothing repeats
  EXPECT_EQ(d.draft(std::vector<TokenId>{3}, 4), std::vector<TokenId>{});
  // the continuation stops at the end of the history
  EXPECT_EQ(d.draft(std::vector<TokenId>{1, 2, 1, 2}, 8), (std::vector<TokenId>{1, 2}));
}

TEST(Ngram, MakeDrafterNamesErrors) {
  EXPECT_EQ(make_drafter("none")->get(), nullptr);
  EXPECT_EQ((*make_drafter("ngram"))->name(), "ngram");
  EXPECT_TRUE(check_drafter_name("mtp").ok());  // made on a session (test_mtp.cpp)
  EXPECT_FALSE(check_drafter_name("eagle").ok());
  auto bad = make_drafter("eagle");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("eagle"), std::string::npos);
}

// The distribution sample() draws from for these parameters, computed independently: the top k
// logits at the temperature, softmax.
std::vector<double> expected_distribution(const std::vector<float>& logits, float temp, int top_k) {
  std::vector<int> order(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int(i);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[size_t(a)] > logits[size_t(b)]; });
  std::vector<double> p(logits.size(), 0.0);
  double sum = 0;
  for (int j = 0; j < top_k; ++j) sum += p[size_t(order[size_t(j)])] = std::exp((logits[size_t(order[size_t(j)])] - logits[size_t(order[0])]) / temp);
  for (double& x : p) x /= sum;
  return p;
}

// Pearson's chi-square of counts against p (cells with p = 0 must be empty).
double chi_square(const std::vector<int>& counts, const std::vector<double>& p, int n, int& df) {
  double chi = 0;
  df = -1;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has probability 0";
      continue;
    }
    const double e = p[i] * n;
    chi += (counts[i] - e) * (counts[i] - e) / e;
    ++df;
  }
  return chi;
}

// For drafts of high, middling, low and zero probability, the tokens verify() returns are
// distributed as sample()'s, and the draft is accepted with its probability. 200,000 draws per
// draft; the chi-square bound 35 is above the 1e-5 quantile for df <= 7 (the draws are seeded:
// the test is deterministic, the bound says how far off a wrong rule would have to be to pass).
TEST(SpeculativeSampling, VerifyKeepsTheTargetDistribution) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.5f);
  std::vector<float> logits(12);
  for (float& x : logits) x = nd(rng);
  const float temp = 0.8f;
  const int top_k = 8;
  const std::vector<double> p = expected_distribution(logits, temp, top_k);
  std::vector<int> by_p(p.size());
  for (size_t i = 0; i < by_p.size(); ++i) by_p[i] = int(i);
  std::sort(by_p.begin(), by_p.end(), [&](int a, int b) { return p[size_t(a)] > p[size_t(b)]; });
  const int n = 200000;
  for (int draft : {by_p[0], by_p[3], by_p[7], by_p[10]}) {
    SCOPED_TRACE("draft " + std::to_string(draft) + " p " + std::to_string(p[size_t(draft)]));
    Sampler s({.temperature = temp, .top_k = top_k, .top_p = 1.0f, .min_p = 0.0f, .seed = uint64_t(draft) + 1});
    std::vector<int> counts(p.size(), 0);
    int accepted = 0;
    for (int i = 0; i < n; ++i) {
      bool ok = false;
      const int32_t t = s.verify(logits, {}, draft, ok);
      ++counts[size_t(t)];
      if (ok) {
        EXPECT_EQ(t, draft);
        ++accepted;
      }
    }
    int df = 0;
    EXPECT_LT(chi_square(counts, p, n, df), 35.0);
    EXPECT_EQ(df, top_k - 1);
    // the acceptance rate is p(draft): binomial standard deviation sqrt(p (1-p) / n) <= 0.0012
    EXPECT_NEAR(double(accepted) / n, p[size_t(draft)], 0.006);
  }
  // greedy: accepted exactly when the draft is the argmax, which is returned either way
  Sampler g({.temperature = 0.0f});
  bool ok = false;
  EXPECT_EQ(g.verify(logits, {}, by_p[0], ok), by_p[0]);
  EXPECT_TRUE(ok);
  EXPECT_EQ(g.verify(logits, {}, by_p[1], ok), by_p[0]);
  EXPECT_FALSE(ok);
}

std::vector<int32_t> some_ids(int n, int seed, int vocab) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& id : v) id = int32_t(rng() % uint32_t(vocab));
  return v;
}

float max_abs_diff(std::span<const float> a, std::span<const float> b) {
  float d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

class SpeculativeArch : public ::testing::TestWithParam<const char*> {};

// A speculative eval of wrong tokens, rewound, leaves the session exactly as if they had never
// been evaluated: the logits that follow equal those of a session that never saw them, for every
// kind of cache. The test runs long enough (40 positions) that deepseek4's ratio-4 blocks complete
// inside rejected drafts, and rewinds to every offset of a block.
TEST_P(SpeculativeArch, RewindForgetsRejectedTokensExactly) {
  std::vector<uint8_t> bytes;
  auto m = test::synth_q8_model(GetParam(), bytes);
  ASSERT_TRUE(m);
  const int V = m->hparams().n_vocab;
  const std::vector<int32_t> truth = some_ids(48, 3, V);
  Session spec(*m, 64, cpu::MatmulPath::exact), plain(*m, 64, cpu::MatmulPath::exact);
  const int k = std::min(6, spec.max_speculation() - 1);
  ASSERT_TRUE(spec.eval(std::span<const int32_t>(truth.data(), 5)));
  ASSERT_TRUE(plain.eval(std::span<const int32_t>(truth.data(), 5)));
  int64_t pos = 5;
  float worst = 0;
  for (int step = 0; pos + k + 1 < int64_t(truth.size()); ++step) {
    // the true token and k drafts, of which the first `keep` are right
    const int keep = step % (k + 1);
    std::vector<int32_t> batch(truth.begin() + pos, truth.begin() + pos + 1 + keep);
    for (int32_t w : some_ids(k - keep, 100 + step, V)) batch.push_back(w);
    spec.begin_speculation();
    auto rows = spec.eval(batch, true);
    ASSERT_TRUE(rows) << rows.error().message;
    spec.rewind(pos + 1 + keep);
    // the plain session evaluates the kept tokens one at a time
    for (int i = 0; i <= keep; ++i) {
      auto want = plain.eval(std::span<const int32_t>(&truth[size_t(pos + i)], 1));
      ASSERT_TRUE(want);
      worst = std::max(worst, max_abs_diff(std::span<const float>(rows->data() + size_t(i) * size_t(V), size_t(V)), *want));
    }
    pos += 1 + keep;
    ASSERT_EQ(spec.n_past(), pos);
  }
  // what follows: two tokens evaluated by both
  auto a = spec.eval(std::span<const int32_t>(&truth[size_t(pos)], 1));
  auto b = plain.eval(std::span<const int32_t>(&truth[size_t(pos)], 1));
  ASSERT_TRUE(a && b);
  worst = std::max(worst, max_abs_diff(*a, *b));
  // the exact path: batch and one-at-a-time evaluation agree to float rounding (1e-4 of logits of
  // order 1-10); a kept rejected row, or a ring slot not restored, moves them by far more
  EXPECT_LT(worst, 1e-4f) << GetParam();
}

// The quantized path as users run it (F16 KV cache for GQA): a verification-size batch (2 .. 12
// tokens) gives logits bit-identical to evaluating its tokens one at a time, so that greedy output
// with drafts is exactly plain decoding's even where two logits are within rounding of each other
// (a random-weight Qwen3-30B-A3B shape hit such near-ties within 33 tokens before the kernels were
// made so; cpu::kBatchInvariantTokens).
TEST_P(SpeculativeArch, VerificationBatchesAreBitIdenticalToOneTokenSteps) {
  std::vector<uint8_t> bytes;
  auto m = test::synth_q8_model(GetParam(), bytes);
  ASSERT_TRUE(m);
  const int V = m->hparams().n_vocab;
  const std::vector<int32_t> toks = some_ids(40, 9, V);
  for (int nb : {2, 5, 8, int(std::min<int64_t>(12, cpu::kBatchInvariantTokens))}) {
    Session batch(*m, 64), one(*m, 64);
    const int n = std::min(nb, batch.max_speculation());
    ASSERT_TRUE(batch.eval(std::span<const int32_t>(toks.data(), 20)));
    ASSERT_TRUE(one.eval(std::span<const int32_t>(toks.data(), 20)));
    auto rows = batch.eval(std::span<const int32_t>(toks.data() + 20, size_t(n)), true);
    ASSERT_TRUE(rows);
    for (int i = 0; i < n; ++i) {
      auto want = one.eval(std::span<const int32_t>(&toks[size_t(20 + i)], 1));
      ASSERT_TRUE(want);
      EXPECT_EQ(max_abs_diff(std::span<const float>(rows->data() + size_t(i) * size_t(V), size_t(V)), *want), 0.0f)
          << GetParam() << ": batch of " << n << ", token " << i;
    }
  }
}

// A drafter that knows the plain run's output and spoils every third token: both acceptance and
// rejection happen at every draft length.
class OracleDrafter final : public Drafter {
 public:
  OracleDrafter(std::vector<TokenId> full, int vocab) : full_(std::move(full)), vocab_(vocab) {}
  std::string name() const override { return "oracle"; }
  std::vector<TokenId> draft(std::span<const TokenId> history, int k) override {
    std::vector<TokenId> d;
    for (size_t i = history.size(); i < full_.size() && int(d.size()) < k; ++i)
      d.push_back(++calls_ % 3 == 0 ? (full_[i] + 1) % vocab_ : full_[i]);
    return d;
  }

 private:
  std::vector<TokenId> full_;
  int vocab_;
  int calls_ = 0;
};

// Greedy generation with each drafter (the n-gram drafter, and the oracle that forces both
// outcomes) gives the same tokens as plain decoding, on the quantized path and its half-precision
// KV cache (what users run): verification's batched pass must not change an argmax.
void expect_greedy_identical(const Model& m, const std::vector<int32_t>& prompt, int n_gen, const std::string& what) {
  SCOPED_TRACE(what);
  auto tok = Tokenizer::from_gguf(m.file());
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  const int ctx = int(prompt.size()) + n_gen + 1;
  auto run = [&](Drafter* d, int max_draft, bool adaptive, GenerateResult* out) {
    Session s(m, ctx);
    Sampler sampler({.temperature = 0.0f});
    std::vector<TokenId> history;
    GenerateOptions o{.n_predict = n_gen, .ignore_eos = true, .drafter = d, .max_draft = max_draft,
                      .adaptive_draft = adaptive};
    auto r = generate(s, *tok, sampler, prompt, history, o, [](std::string_view) {});
    EXPECT_TRUE(r.ok()) << r.error().message;
    if (out != nullptr && r.ok()) *out = *r;
    EXPECT_EQ(s.n_past(), int64_t(history.size()) - 1);  // every output token but the last is cached
    return history;
  };
  const std::vector<TokenId> want = run(nullptr, 0, false, nullptr);
  ASSERT_EQ(want.size(), prompt.size() + size_t(n_gen));
  for (int max_draft : {1, 3, 7}) {
    GenerateResult r;
    OracleDrafter oracle(want, m.hparams().n_vocab);
    EXPECT_EQ(run(&oracle, max_draft, false, &r), want) << "oracle drafts, k = " << max_draft;
    EXPECT_GT(r.n_accepted, 0);
    EXPECT_LT(r.n_accepted, r.n_drafted);
    NgramDrafter ngram;
    EXPECT_EQ(run(&ngram, max_draft, false, nullptr), want) << "n-gram drafts, k = " << max_draft;
    NgramDrafter adaptive;
    EXPECT_EQ(run(&adaptive, max_draft, true, nullptr), want) << "n-gram drafts, adaptive k <= " << max_draft;
  }
}

TEST_P(SpeculativeArch, GreedyOutputIdenticalToPlainDecoding) {
  std::vector<uint8_t> bytes;
  auto m = test::synth_q8_model(GetParam(), bytes);
  ASSERT_TRUE(m);
  expect_greedy_identical(*m, some_ids(9, 5, m->hparams().n_vocab), 24, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Archs, SpeculativeArch,
                         ::testing::Values("tiny", "tiny-deepseek2", "tiny-gpt-oss", "tiny-mixtral", "tiny-deepseek4",
                                           "tiny-deepseek41"));

// A drafter that ignores k (proposes the whole rest of the plain run) is cut to k: same output, no
// step longer than the context or deepseek4's rings allow.
TEST(SpeculativeGenerate, DraftsBeyondKAreCut) {
  std::vector<uint8_t> bytes;
  auto m = test::synth_q8_model("tiny-deepseek4", bytes);
  ASSERT_TRUE(m);
  auto tok = Tokenizer::from_gguf(m->file());
  ASSERT_TRUE(tok.ok());
  const std::vector<int32_t> prompt = some_ids(6, 2, m->hparams().n_vocab);
  auto run = [&](Drafter* d) {
    Session s(*m, 40);
    Sampler sampler({.temperature = 0.0f});
    std::vector<TokenId> history;
    GenerateOptions o{.n_predict = 30, .ignore_eos = true, .drafter = d, .max_draft = 12, .adaptive_draft = false};
    auto r = generate(s, *tok, sampler, prompt, history, o, [](std::string_view) {});
    EXPECT_TRUE(r.ok()) << r.error().message;
    return history;
  };
  const std::vector<TokenId> want = run(nullptr);
  struct Greedy final : Drafter {
    const std::vector<TokenId>& full;
    explicit Greedy(const std::vector<TokenId>& f) : full(f) {}
    std::string name() const override { return "greedy"; }
    std::vector<TokenId> draft(std::span<const TokenId> h, int) override {
      return {full.begin() + long(std::min(h.size(), full.size())), full.end()};
    }
  } greedy(want);
  EXPECT_EQ(run(&greedy), want);
}

// The llama.cpp fixture models (every architecture and quantization): greedy decoding of the
// fixture's greedy prompt, with and without drafts, token for token.
TEST(SpeculativeFixtures, GreedyOutputIdenticalToPlainDecoding) {
  const auto models = test::fixture_models();
  if (models.empty()) GTEST_SKIP() << "../shared/fixtures not found: fixture models not checked";
  for (const auto& path : models) {
    auto m = Model::load(path.string(), MappedFile::Mode::ram);
    ASSERT_TRUE(m.ok()) << m.error().message;
    const std::vector<int32_t> prompt = some_ids(8, 11, (*m)->hparams().n_vocab);
    expect_greedy_identical(**m, prompt, 32, path.parent_path().filename().string() + "/" + path.filename().string());
  }
}

// Step costs of a model where drafting pays or does not: one plain step 10 ms, each drafted token
// `slope` of one more.
struct SimulatedSteps {
  double slope, acceptance;
  std::mt19937 rng{42};
  // tokens produced and time taken by a step of k drafts
  std::pair<int, double> step(DraftController& c, int k) {
    int accepted = 0;
    while (accepted < k && std::uniform_real_distribution<double>(0, 1)(rng) < acceptance) ++accepted;
    const double t = 0.010 * (1.0 + slope * k);
    c.record(k, accepted, t);
    return {accepted + 1, t};
  }
};

// With drafts that are never accepted the controller stays at k = 0 but for rare probes: under 3%
// more time than plain decoding. With drafts that are usually right and cheap it drafts several
// and wins.
TEST(DraftController, TurnsDownADrafterThatDoesNotPay) {
  for (double slope : {0.2, 1.0}) {
    DraftController c(8);
    SimulatedSteps sim{slope, 0.0};
    double time = 0;
    int tokens = 0;
    for (int i = 0; i < 2000; ++i) {
      auto [n, t] = sim.step(c, c.choose(8));
      tokens += n;
      time += t;
    }
    const double plain = 0.010 * tokens;
    EXPECT_LT(time, 1.03 * plain) << "slope " << slope;
    EXPECT_EQ(c.choose(8), 0);
  }
}

TEST(DraftController, DraftsWhenItPays) {
  DraftController c(8);
  SimulatedSteps sim{0.1, 0.8};
  double time = 0;
  int tokens = 0;
  for (int i = 0; i < 500; ++i) {
    auto [n, t] = sim.step(c, c.choose(8));
    if (i < 100) continue;  // settled
    tokens += n;
    time += t;
  }
  EXPECT_NEAR(c.acceptance(), 0.8, 0.1);
  EXPECT_GE(c.choose(8), 3);
  // expected speedup at the best k is about 2.5x here; ask for 1.8x measured
  EXPECT_GT(0.010 * tokens / time, 1.8);
  EXPECT_LE(c.choose(2), 2);  // the room is respected
}

}  // namespace
}  // namespace strata
