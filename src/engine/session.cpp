#include "engine/session.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>

#include "model/forward.h"
#include "storage/expert_store.h"

namespace strata {

namespace {
// Errors: a routed expert the NVMe tier could not read (its computation used zeros instead: the
// logits are not returned, and the caller's position does not advance).
Status run_forward(const Model& m, const cpu::CpuBackend& be, std::span<const SeqSpan> seqs, const int32_t* tokens,
                   bool all_logits, float* logits) {
  switch (m.hparams().arch) {
    case Arch::qwen3moe:
    case Arch::qwen2moe:
    case Arch::llama:
    case Arch::gpt_oss:
      forward_gqa_moe(m, be, seqs, tokens, all_logits, logits);
      break;
    case Arch::deepseek2:
      forward_deepseek2(m, be, seqs, tokens, all_logits, logits);
      break;
    case Arch::deepseek4:
      forward_deepseek4(m, be, seqs, tokens, all_logits, logits);
      break;
  }
  return m.expert_store ? m.expert_store->take_error() : Status::success();
}
}  // namespace

Session::Session(const Model& model, int n_ctx, cpu::MatmulPath path, KvType kv)
    : model_(model), backend_(path) {
  init_cache(model, n_ctx, cache_, path == cpu::MatmulPath::exact ? KvType::f32 : kv);
}

Status Session::check(std::span<const int32_t> tokens) const {
  const HParams& hp = model_.hparams();
  if (tokens.empty()) return Error{"eval: no tokens"};
  for (int32_t id : tokens) {
    if (id < 0 || id >= hp.n_vocab)
      return Error{strfmt("eval: token id %d is outside the vocabulary (0..%d)", id, hp.n_vocab - 1)};
  }
  const int64_t n = int64_t(tokens.size());
  if (n_past_ + n > cache_.n_ctx) {
    return Error{strfmt("eval: context full: %" PRId64 " tokens cached + %" PRId64 " new > context %d",
                        n_past_, n, cache_.n_ctx)};
  }
  return {};
}

Result<std::vector<float>> Session::eval(std::span<const int32_t> tokens, bool all_logits) {
  const HParams& hp = model_.hparams();
  if (Status s = check(tokens); !s) return s.error();
  const int64_t n = int64_t(tokens.size());
  std::vector<float> logits(size_t((all_logits ? n : 1) * hp.n_vocab));
  const SeqSpan seq{&cache_, n_past_, n};
  STRATA_TRY(run_forward(model_, backend_, std::span<const SeqSpan>(&seq, 1), tokens.data(), all_logits, logits.data()));
  n_past_ += n;
  return logits;
}

Result<std::vector<float>> Session::eval_batch(std::span<Session* const> sessions,
                                              std::span<const std::vector<int32_t>> tokens) {
  STRATA_CHECK(sessions.size() == tokens.size());
  if (sessions.empty()) return Error{"eval_batch: no sequences"};
  const Model& m = sessions[0]->model_;
  const HParams& hp = m.hparams();
  std::vector<SeqSpan> seqs;
  std::vector<int32_t> all;
  for (size_t s = 0; s < sessions.size(); ++s) {
    Session& se = *sessions[s];
    STRATA_CHECK(&se.model_ == &m && se.backend_.path() == sessions[0]->backend_.path(),
                 "eval_batch: sessions of different models or paths");
    for (size_t o = 0; o < s; ++o) STRATA_CHECK(sessions[o] != &se, "eval_batch: a session twice");
    if (Status st = se.check(tokens[s]); !st) return st.error();
    const int64_t n = int64_t(tokens[s].size());
    seqs.push_back({&se.cache_, se.n_past_, n});
    all.insert(all.end(), tokens[s].begin(), tokens[s].end());
  }
  std::vector<float> logits(sessions.size() * size_t(hp.n_vocab));
  STRATA_TRY(run_forward(m, sessions[0]->backend_, seqs, all.data(), false, logits.data()));
  for (size_t s = 0; s < sessions.size(); ++s) sessions[s]->n_past_ += int64_t(tokens[s].size());
  return logits;
}

int32_t argmax(std::span<const float> logits) {
  // the largest value with eight independent running maxima (the one-chain loop took 0.7 ms per
  // 152k-token vocabulary, a 1.5% of a decoded token), then its first index; NaN never wins
  float m[8];
  std::fill(m, m + 8, -INFINITY);
  const size_t n = logits.size(), n8 = n / 8 * 8;
  for (size_t i = 0; i < n8; i += 8)
    for (int j = 0; j < 8; ++j) m[j] = logits[i + size_t(j)] > m[j] ? logits[i + size_t(j)] : m[j];
  for (size_t i = n8; i < n; ++i) m[0] = logits[i] > m[0] ? logits[i] : m[0];
  const float mx = *std::max_element(m, m + 8);
  for (size_t i = 0; i < n; ++i)
    if (logits[i] == mx) return int32_t(i);
  return 0;  // empty, or nothing above -inf
}

}  // namespace strata
