// The trained demo model (tests/data/models/demo, made by scripts/train-demo.sh): the quality of
// the default (quantized-activation) path against strata's exact float path on held-out text, the
// perplexity command's reference file, and that the model and its chat template give English.
//
// Bounds, from the figures measured on the committed file (bench/RESULTS.md, "Issue #31"), with
// margin: on the first 8 chunks of 512 of the held-out books (2,040 scored tokens), Q8_0's default
// path agreed with the exact path on top-1 for 0.9956 of them (9 tokens differ) at mean KL
// 0.000148, p99 0.0010 (AMD EPYC, AVX2) -> bounds top-1 >= 0.99, mean KL <= 0.002 (the issue's,
// 13x the measured mean); the exact path's perplexity there was 36.83 -> bound 45 (the untrained
// initial weights score about 2,200).
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "engine/engine.h"
#include "engine/perplexity.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "test_support.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

fs::path demo_dir() { return test::data_dir() / "models" / "demo"; }
fs::path demo_model() { return demo_dir() / "strata-demo-Q8_0.gguf"; }

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Demo {
  std::unique_ptr<Engine> engine;
  std::vector<int32_t> heldout;
};

Demo& demo() {
  static Demo d = [] {
    Demo x;
    auto m = Model::load(demo_model().string());
    STRATA_CHECK(m.ok(), "the committed demo model loads");
    auto tok = Tokenizer::from_gguf((*m)->file());
    STRATA_CHECK(tok.ok(), "the demo model's tokenizer loads");
    x.heldout = tok->tokenize(slurp(demo_dir() / "heldout.txt"), false, false);
    x.engine = std::make_unique<Engine>(std::move(*m));
    return x;
  }();
  return d;
}

TEST(DemoModel, DefaultPathAgreesWithTheExactPath) {
  Demo& d = demo();
  PerplexityOptions o{.n_ctx = 512, .max_chunks = 8, .kl_exact = true};
  auto r = perplexity(*d.engine, d.heldout, o);
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_TRUE(r->kl);
  EXPECT_EQ(r->n_chunks, 8);
  EXPECT_EQ(r->n_scored, 8 * 255);
  std::printf("demo Q8_0, default vs exact: ppl %.4f (exact %.4f), top-1 %.4f, KL mean %.6f p99 %.6f, RMS dp %.4f\n",
              r->ppl, r->kl->ppl_ref, r->kl->top1, r->kl->mean, r->kl->p99, r->kl->rms_dp);
  EXPECT_GE(r->kl->top1, 0.99);
  EXPECT_LE(r->kl->mean, 0.002);
  EXPECT_GT(r->kl->mean, 0.0);  // the paths differ: activations are quantized on one of them
  EXPECT_LT(r->kl->ppl_ref, 45.0);
  EXPECT_GT(r->kl->ppl_ref, 1.0);
  EXPECT_NEAR(std::log(r->ppl / r->kl->ppl_ref), 0.0, 0.01);
}

// --kl-base: the file a first run writes is what a second run compares with; comparing a path
// with its own base gives zero divergence, and files of another context or text are refused.
TEST(DemoModel, BaseFileRoundTripsAndRefusesOtherRuns) {
  Demo& d = demo();
  const fs::path dir = test::scratch_dir("demo_kl_base");
  const std::string base = (dir / "exact.klb").string();
  PerplexityOptions w{.n_ctx = 256, .max_chunks = 2, .path = cpu::MatmulPath::exact, .kl_base = base};
  auto written = perplexity(*d.engine, d.heldout, w);
  ASSERT_TRUE(written) << written.error().message;
  EXPECT_TRUE(written->wrote_base);
  EXPECT_FALSE(written->kl);
  ASSERT_TRUE(fs::exists(base));

  auto same = perplexity(*d.engine, d.heldout, w);  // the exact path against its own base
  ASSERT_TRUE(same) << same.error().message;
  ASSERT_TRUE(same->kl);
  EXPECT_FALSE(same->wrote_base);
  EXPECT_LT(same->kl->mean, 1e-9);
  EXPECT_EQ(same->kl->top1, 1.0);
  EXPECT_DOUBLE_EQ(same->kl->ppl_ref, written->ppl);

  PerplexityOptions q = w;
  q.path = cpu::MatmulPath::quantized;
  auto from_file = perplexity(*d.engine, d.heldout, q);
  PerplexityOptions e{.n_ctx = 256, .max_chunks = 2, .kl_exact = true};
  auto in_run = perplexity(*d.engine, d.heldout, e);
  ASSERT_TRUE(from_file && in_run);
  EXPECT_NEAR(from_file->kl->mean, in_run->kl->mean, 1e-9);  // the file holds the exact path's log-probs
  EXPECT_EQ(from_file->kl->top1, in_run->kl->top1);

  PerplexityOptions other_ctx = w;
  other_ctx.n_ctx = 128;
  other_ctx.max_chunks = 4;
  auto r = perplexity(*d.engine, d.heldout, other_ctx);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("--ctx 256"), std::string::npos) << r.error().message;
  std::vector<int32_t> shifted(d.heldout.begin() + 1, d.heldout.end());
  r = perplexity(*d.engine, shifted, w);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("other tokens"), std::string::npos) << r.error().message;
  fs::resize_file(base, fs::file_size(base) - 4);
  r = perplexity(*d.engine, d.heldout, w);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("truncated"), std::string::npos) << r.error().message;
}

TEST(DemoModel, PerplexityRefusesWhatCannotBeScored) {
  Demo& d = demo();
  std::vector<int32_t> few(d.heldout.begin(), d.heldout.begin() + 100);
  auto r = perplexity(*d.engine, few, {.n_ctx = 512});
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("fewer than one chunk"), std::string::npos) << r.error().message;
  r = perplexity(*d.engine, d.heldout, {.n_ctx = 4096});
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("training context"), std::string::npos) << r.error().message;
  r = perplexity(*d.engine, d.heldout, {.n_ctx = 256, .kl_exact = true, .kl_base = "x"});
  ASSERT_FALSE(r);
}

// The words of a text, lower-cased, letters only.
std::vector<std::string> words(const std::string& text) {
  std::vector<std::string> out;
  std::string w;
  for (char c : text + " ") {
    if (std::isalpha(static_cast<unsigned char>(c))) {
      w += char(std::tolower(static_cast<unsigned char>(c)));
    } else if (!w.empty()) {
      out.push_back(w);
      w.clear();
    }
  }
  return out;
}

// The share of `text`'s words that are words of the King James Bible (the list train-demo.sh
// wrote from the corpus). A random-weight model strings sub-word pieces into non-words.
double share_of_bible_words(const std::string& text, size_t* n_words) {
  static const std::set<std::string> dict = [] {
    std::set<std::string> s;
    for (const std::string& w : words(slurp(demo_dir() / "kjv-words.txt"))) s.insert(w);
    return s;
  }();
  const std::vector<std::string> ws = words(text);
  size_t known = 0;
  for (const std::string& w : ws) known += dict.count(w);
  *n_words = ws.size();
  return ws.empty() ? 0.0 : double(known) / double(ws.size());
}

// What a new user sees: `strata run` with no model and no prompt is the demo model continuing its
// default prompt in English. ($STRATA_MODEL, which points the other tests at the llama.cpp
// fixture, is unset for this one; ctest runs each test in a process of its own.)
TEST(DemoModel, RunWithoutArgumentsPrintsEnglish) {
  const char* saved = std::getenv("STRATA_MODEL");
  const std::string keep = saved ? saved : "";
  unsetenv("STRATA_MODEL");
  std::string out;
  const int rc = test::run_cli("run -n 64 --seed 1", &out, true);
  if (!keep.empty()) setenv("STRATA_MODEL", keep.c_str(), 1);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(out.rfind("In the beginning", 0), 0u) << out;
  size_t n = 0;
  const double share = share_of_bible_words(out, &n);
  std::printf("demo model: %zu words, %.3f of them the corpus's\n", n, share);
  EXPECT_GE(n, 20u) << out;
  EXPECT_GE(share, 0.8) << out;  // measured 0.952 (random weights: 0.22)
}

// The same measure on the random-weight fixture: it fails, so the bound above means something.
TEST(DemoModel, RandomWeightsDoNotPassTheEnglishCheck) {
  std::string out;
  ASSERT_EQ(test::run_cli("run -n 64 --seed 1 -p \"In the beginning\"", &out, true), 0) << out;
  size_t n = 0;
  const double share = share_of_bible_words(out.substr(16), &n);
  std::printf("random weights: %zu words, %.3f of them the corpus's\n", n, share);
  EXPECT_LT(share, 0.6) << out;
}

// strata chat with the demo model's own template: a user turn on stdin gets an English reply that
// ends (the model was trained to close its turns with <|im_end|>).
TEST(DemoModel, ChatAnswersInEnglishWithItsTemplate) {
  const fs::path dir = test::scratch_dir("demo_chat");
  {
    std::ofstream in(dir / "turns.txt");
    in << "And God said, Let there be light: and there was light.\n";
  }
  std::string out;
  ASSERT_EQ(test::run_cli("chat -m \"" + demo_model().string() + "\" --temp 0 -n 200 < \"" + (dir / "turns.txt").string() + "\"",
                          &out, true),
            0)
      << out;
  size_t n = 0;
  EXPECT_GE(share_of_bible_words(out, &n), 0.8) << out;
  EXPECT_GE(n, 3u) << out;
  EXPECT_EQ(out.find("<|im_"), std::string::npos) << out;  // the turn markers are not printed
}

}  // namespace
}  // namespace strata
