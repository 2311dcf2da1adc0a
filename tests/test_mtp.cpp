// The multi-token-prediction (MTP) drafter: the nextn layer loads without changing the main model,
// its input projection matches a scalar reference, drafts made step by step through verification
// and rewinds equal those of a fresh computation over the same history, greedy output with MTP
// drafts is plain decoding's, and models without a usable MTP layer say why.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "cpu/quant_traits.h"
#include "engine/generate.h"
#include "engine/session.h"
#include "engine/speculative.h"
#include "model/forward.h"
#include "model/synth.h"
#include "test_support.h"

namespace strata {
namespace {


class MtpArch : public ::testing::TestWithParam<const char*> {};

// The nextn layer is loaded as Model::mtp and leaves the main model as it was: the same seed with
// and without it gives bit-identical logits.
TEST_P(MtpArch, NextnLayerLoadsBesideTheUnchangedMainModel) {
  std::vector<uint8_t> with_bytes, without_bytes;
  auto with = test::synth_q8_model(GetParam(), with_bytes, 1);
  auto without = test::synth_q8_model(GetParam(), without_bytes);
  ASSERT_TRUE(with && without);
  ASSERT_NE(with->mtp, nullptr) << with->mtp_error;
  EXPECT_EQ(without->mtp, nullptr);
  EXPECT_NE(without->mtp_error.find("no multi-token-prediction"), std::string::npos) << without->mtp_error;
  EXPECT_EQ(with->hparams().n_layer, without->hparams().n_layer);
  EXPECT_EQ(with->hparams().n_nextn, 1);
  EXPECT_EQ(with->mtp->il, with->hparams().n_layer);
  const std::vector<int32_t> ids = test::random_ids(7, 3, with->hparams().n_vocab);
  Session a(*with, 16), b(*without, 16);
  auto la = a.eval(ids, true), lb = b.eval(ids, true);
  ASSERT_TRUE(la && lb);
  EXPECT_EQ(*la, *lb);
  // no MTP layer: the drafter says so
  auto d = make_drafter("mtp", &b);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().message.find("no multi-token-prediction"), std::string::npos) << d.error().message;
}

// mtp_input = eh_proj [enorm(embed(t)) ; hnorm(h)], against a scalar reference that dequantizes
// the file's rows (the loaded weights may be interleaved) and sums in double. Exact path:
// float activations, so the difference is float rounding (relative 1e-4).
TEST_P(MtpArch, InputProjectionMatchesAScalarReference) {
  std::vector<uint8_t> bytes;
  auto m = test::synth_q8_model(GetParam(), bytes, 1);
  ASSERT_TRUE(m && m->mtp);
  // the file as written: synth_q8_model's bytes were repacked in place, so write them again
  const SynthShape* shape = find_synth_shape(GetParam());
  auto plan = build_synth_plan(*shape, SynthQuant::q8_0, {.mtp_layers = 1});
  ASSERT_TRUE(plan.ok());
  const std::vector<uint8_t> raw = plan->write_memory();
  auto file = GgufFile::parse(raw, "raw");
  ASSERT_TRUE(file.ok());
  const HParams& hp = m->hparams();
  const int64_t E = hp.n_embd, n = 3;
  const std::vector<int32_t> ids = test::random_ids(int(n), 7, hp.n_vocab);
  std::mt19937 rng(11);
  std::normal_distribution<float> N(0.0f, 2.0f);
  std::vector<float> h_prev(size_t(n * E)), x(size_t(n * E));
  for (float& v : h_prev) v = N(rng);
  mtp_input(*m, CpuBackend(cpu::MatmulPath::exact), ids.data(), h_prev.data(), n, x.data());

  auto tensor = [&](const std::string& name) {
    const GgufTensorInfo* t = file->find_tensor(name);
    EXPECT_NE(t, nullptr) << name;
    return t;
  };
  const GgufTensorInfo* emb = tensor("token_embd.weight");
  const GgufTensorInfo* proj = tensor(strfmt("blk.%d.nextn.eh_proj.weight", hp.n_layer));
  ASSERT_TRUE(emb && proj);
  auto rms = [&](const float* v, const float* w, float* out) {
    double ss = 0;
    for (int64_t i = 0; i < E; ++i) ss += double(v[i]) * v[i];
    const double s = 1.0 / std::sqrt(ss / double(E) + double(hp.eps));
    for (int64_t i = 0; i < E; ++i) out[i] = float(v[i] * s) * w[i];
  };
  const auto& et = quant_traits(emb->type);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<float> e(static_cast<size_t>(E)), cat(static_cast<size_t>(2 * E));
    et.dequantize_row(file->tensor_data(*emb).data() + size_t(ids[size_t(t)]) * emb->row_bytes(), e.data(), E);
    rms(e.data(), f32(m->mtp->enorm), cat.data());
    rms(h_prev.data() + t * E, f32(m->mtp->hnorm), cat.data() + E);
    for (int64_t o = 0; o < E; ++o) {
      const double want =
          vec_dot_exact(proj->type, 2 * E, file->tensor_data(*proj).data() + size_t(o) * proj->row_bytes(), cat.data());
      ASSERT_NEAR(x[size_t(t * E + o)], want, 1e-4 * (1.0 + std::abs(want))) << "token " << t << " row " << o;
    }
  }
}

// Verification steps with drafts partly accepted, rewinds, and the drafter's incremental cache:
// after every step its first draft's logits and its drafts equal those of a fresh target and a
// fresh drafter that evaluate the same history in one go (the exact path: the two differ only by
// float rounding between batch shapes).
TEST_P(MtpArch, IncrementalDraftsEqualAFreshComputation) {
  std::vector<uint8_t> bytes;
  auto m = test::synth_q8_model(GetParam(), bytes, 1);
  ASSERT_TRUE(m && m->mtp);
  const int V = m->hparams().n_vocab, ctx = 64, k = 3;
  Session target(*m, ctx, cpu::MatmulPath::exact);
  auto drafter = MtpDrafter::create(target);
  ASSERT_TRUE(drafter.ok()) << drafter.error().message;
  std::vector<int32_t> history = test::random_ids(9, 5, V);
  ASSERT_TRUE(target.eval(std::span<const int32_t>(history.data(), history.size() - 1)));
  std::mt19937 rng(17);
  for (int step = 0; step < 8; ++step) {
    const std::vector<TokenId> drafts = (*drafter)->draft(history, k);
    ASSERT_EQ(int(drafts.size()), k);
    {
      Session fresh(*m, ctx, cpu::MatmulPath::exact);
      auto fd = MtpDrafter::create(fresh);
      ASSERT_TRUE(fd.ok());
      ASSERT_TRUE(fresh.eval(std::span<const int32_t>(history.data(), history.size() - 1)));
      const std::vector<TokenId> want = (*fd)->draft(history, k);
      float worst = 0;
      for (size_t i = 0; i < size_t(V); ++i)
        worst = std::max(worst, std::abs((*drafter)->first_logits()[i] - (*fd)->first_logits()[i]));
      EXPECT_LT(worst, 1e-3f) << "step " << step;
      EXPECT_EQ(drafts, want) << "step " << step;
    }
    // verify: the pending token and the drafts, the first `keep` of them taken (the rest rewound),
    // then a token of our own choosing as the one after them
    const int keep = int(rng() % uint32_t(k + 1));
    std::vector<int32_t> batch{history.back()};
    batch.insert(batch.end(), drafts.begin(), drafts.end());
    const int64_t pos0 = target.n_past();
    target.begin_speculation();
    ASSERT_TRUE(target.eval(batch, true));
    target.rewind(pos0 + 1 + keep);
    history.insert(history.end(), drafts.begin(), drafts.begin() + keep);
    history.push_back(int32_t(rng() % uint32_t(V)));
    // now and then a plain step, whose row the drafter catches up with later
    if (step % 3 == 2) {
      ASSERT_TRUE(target.eval(std::span<const int32_t>(&history.back(), 1)));
      history.push_back(int32_t(rng() % uint32_t(V)));
    }
  }
}

// The drafter's contract with forward_mtp: entry q pairs the target's hidden row of position q with
// token q + 1, at position q. With a prompt of 4 tokens and the pending fifth, the first draft's
// logits are forward_mtp's over positions 0..3 from rows 0..3 and tokens 1..4.
TEST_P(MtpArch, PairsEachHiddenRowWithTheNextToken) {
  std::vector<uint8_t> bytes;
  auto m = test::synth_q8_model(GetParam(), bytes, 1);
  ASSERT_TRUE(m && m->mtp);
  const int64_t E = m->hparams().n_embd;
  Session target(*m, 16, cpu::MatmulPath::exact);
  auto drafter = MtpDrafter::create(target);
  ASSERT_TRUE(drafter.ok());
  const std::vector<int32_t> history = test::random_ids(5, 21, m->hparams().n_vocab);
  ASSERT_TRUE(target.eval(std::span<const int32_t>(history.data(), 4)));
  std::vector<float> rows(size_t(4 * E));
  for (int q = 0; q < 4; ++q) {
    ASSERT_NE(target.hidden_row(q), nullptr);
    std::copy_n(target.hidden_row(q), E, rows.data() + q * E);
  }
  ASSERT_EQ((*drafter)->draft(history, 1).size(), 1u);
  KvCache cache;
  init_mtp_cache(*m, 16, cache);
  std::vector<float> logits(size_t(m->hparams().n_vocab)), out(size_t(4 * E));
  const SeqSpan seq{&cache, 0, 4};
  forward_mtp(*m, CpuBackend(cpu::MatmulPath::exact), std::span<const SeqSpan>(&seq, 1), history.data() + 1,
              rows.data(), false, logits.data(), out.data());
  EXPECT_EQ((*drafter)->first_logits(), logits);
}

// Greedy generation with MTP drafts (fixed k and adaptive) gives plain decoding's tokens, on the
// quantized path with the F16 KV cache.
TEST_P(MtpArch, GreedyOutputIdenticalToPlainDecoding) {
  std::vector<uint8_t> bytes;
  auto m = test::synth_q8_model(GetParam(), bytes, 1);
  ASSERT_TRUE(m && m->mtp);
  auto tok = Tokenizer::from_gguf(m->file());
  ASSERT_TRUE(tok.ok());
  const std::vector<int32_t> prompt = test::random_ids(9, 5, m->hparams().n_vocab);
  const int n_gen = 24;
  auto run = [&](bool mtp, int max_draft, bool adaptive, GenerateResult* out) {
    Session s(*m, int(prompt.size()) + n_gen + 1);
    std::unique_ptr<Drafter> d;
    if (mtp) {
      auto made = make_drafter("mtp", &s);
      EXPECT_TRUE(made.ok());
      if (made.ok()) d = std::move(*made);
    }
    Sampler sampler({.temperature = 0.0f});
    std::vector<TokenId> history;
    GenerateOptions o{.n_predict = n_gen, .ignore_eos = true, .drafter = d.get(), .max_draft = max_draft,
                      .adaptive_draft = adaptive};
    auto r = generate(s, *tok, sampler, prompt, history, o, [](std::string_view) {});
    EXPECT_TRUE(r.ok()) << r.error().message;
    if (out != nullptr && r.ok()) *out = *r;
    return history;
  };
  const std::vector<TokenId> want = run(false, 0, false, nullptr);
  for (int k : {1, 3}) {
    GenerateResult r;
    EXPECT_EQ(run(true, k, false, &r), want) << "k = " << k;
    EXPECT_GT(r.n_drafted, 0);
  }
  EXPECT_EQ(run(true, 4, true, nullptr), want) << "adaptive";
}

INSTANTIATE_TEST_SUITE_P(Archs, MtpArch, ::testing::Values("tiny", "tiny-deepseek2", "tiny-gpt-oss", "tiny-mixtral"));

// deepseek4's nextn layers are counted and skipped, with the reason; synth refuses to write them.
TEST(Mtp, Deepseek4SaysItIsNotBuilt) {
  EXPECT_FALSE(build_synth_plan(*find_synth_shape("tiny-deepseek4"), SynthQuant::q8_0, {.mtp_layers = 1}).ok());
  std::vector<uint8_t> bytes;
  auto m = test::synth_q8_model("tiny-deepseek4", bytes);
  ASSERT_TRUE(m);
  Session s(*m, 16);
  auto d = make_drafter("mtp", &s);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().message.find("no multi-token-prediction"), std::string::npos) << d.error().message;
}

}  // namespace
}  // namespace strata
