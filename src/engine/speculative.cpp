#include "engine/speculative.h"

#include <algorithm>
#include <cmath>

#include "engine/session.h"
#include "model/forward.h"

namespace strata {

std::vector<TokenId> NgramDrafter::draft(std::span<const TokenId> history, int k) {
  const int64_t L = int64_t(history.size());
  if (k <= 0) return {};
  for (int n = std::min<int64_t>(max_n_, L - 1); n >= min_n_; --n) {
    const TokenId* suffix = history.data() + (L - n);
    // the latest earlier occurrence: it starts before the suffix does and something follows it
    for (int64_t j = L - n - 1; j >= 0; --j) {
      if (!std::equal(suffix, suffix + n, history.data() + j)) continue;
      const int64_t from = j + n, to = std::min(L, from + k);
      return {history.begin() + from, history.begin() + to};
    }
  }
  return {};
}

MtpDrafter::~MtpDrafter() { target_.backend().release_cache(cache_); }  // its device copy (the KV mirror)

MtpDrafter::MtpDrafter(Session& target) : target_(target) {
  init_mtp_cache(target.model(), target.n_ctx(), cache_,
                 target.path() == cpu::MatmulPath::exact ? KvType::f32 : target.kv_type());
  target.keep_hidden(true);
}

Result<std::unique_ptr<MtpDrafter>> MtpDrafter::create(Session& target) {
  const Model& m = target.model();
  if (m.mtp == nullptr) return Error{"drafter \"mtp\": " + m.mtp_error};
  return std::unique_ptr<MtpDrafter>(new MtpDrafter(target));
}

std::vector<TokenId> MtpDrafter::draft(std::span<const TokenId> history, int k) {
  const Model& m = target_.model();
  const int64_t E = m.hparams().n_embd, P = target_.n_past();
  if (k <= 0 || int64_t(history.size()) != P + 1 || P == 0) return {};
  // entry q needs the target's row h_q and token q+1; rows the target no longer holds (it was
  // truncated below them and re-evaluated without keeping rows) leave their entries as they were
  n_exact_ = std::min(n_exact_, P);
  while (n_exact_ < P && target_.hidden_row(n_exact_) == nullptr) ++n_exact_;
  if (n_exact_ == P) return {};  // nothing kept to draft from
  const Backend& be = target_.backend();
  const int64_t n = P - n_exact_;
  std::vector<float> logits(static_cast<size_t>(m.hparams().n_vocab)), rows(static_cast<size_t>(n * E)),
      out(static_cast<size_t>(n * E));
  for (int64_t q = n_exact_; q < P; ++q) std::copy_n(target_.hidden_row(q), E, rows.data() + (q - n_exact_) * E);
  const SeqSpan seq{&cache_, n_exact_, n};
  forward_mtp(m, be, std::span<const SeqSpan>(&seq, 1), history.data() + n_exact_ + 1, rows.data(), false,
              logits.data(), out.data());
  n_exact_ = P;
  target_.release_hidden(P);
  first_logits_ = logits;

  std::vector<TokenId> drafts{argmax(logits)};
  std::vector<float> h(out.end() - E, out.end()), next_h(static_cast<size_t>(E));
  for (int64_t pos = P; int(drafts.size()) < k && pos < cache_.n_ctx; ++pos) {
    const SeqSpan one{&cache_, pos, 1};
    forward_mtp(m, be, std::span<const SeqSpan>(&one, 1), &drafts.back(), h.data(), false, logits.data(),
                next_h.data());
    drafts.push_back(argmax(logits));
    h.swap(next_h);
  }
  return drafts;
}

Status check_drafter_name(const std::string& name) {
  if (name.empty() || name == "none" || name == "ngram" || name == "mtp") return Status::success();
  return Error{"unknown drafter \"" + name + "\" (none, ngram, mtp)"};
}

Result<std::unique_ptr<Drafter>> make_drafter(const std::string& name, Session* target) {
  STRATA_TRY(check_drafter_name(name));
  if (name.empty() || name == "none") return std::unique_ptr<Drafter>();
  if (name == "ngram") return std::unique_ptr<Drafter>(std::make_unique<NgramDrafter>());
  if (name == "mtp") {
    STRATA_CHECK(target != nullptr, "make_drafter: \"mtp\" needs the target session");
    auto d = MtpDrafter::create(*target);
    if (!d) return d.error();
    return std::unique_ptr<Drafter>(std::move(*d));
  }
  STRATA_CHECK(false, "make_drafter: a drafter name check_drafter_name accepts is not made");
  return Error{"unreachable"};
}

namespace {
constexpr double kDecay = 0.95;       // per step with drafts: about the last 20 steps count
constexpr double kTimeWeight = 0.2;   // a new step time's weight in its k's mean
constexpr double kPriorSlope = 0.3;   // a drafted token's cost in plain steps, before measuring
constexpr int kProbeMax = 256;
constexpr double kMargin = 0.03;      // expected speed-up drafting must promise
}  // namespace

double tokens_per_step(double a, int k) {
  if (a >= 1.0) return double(k + 1);
  return (1.0 - std::pow(a, k + 1)) / (1.0 - a);
}

DraftController::DraftController(int max_k, bool adaptive)
    : max_k_(std::max(0, max_k)), adaptive_(adaptive), seconds_(size_t(max_k_ + 1), 0.0) {}

double DraftController::step_seconds(int k) const {
  if (seconds_[size_t(k)] > 0) return seconds_[size_t(k)];
  const double t0 = seconds_[0];
  // the nearest measured k' > 0: scale its extra time per drafted token
  for (int d = 1; d <= max_k_; ++d) {
    for (int kk : {k - d, k + d}) {
      if (kk <= 0 || kk > max_k_ || seconds_[size_t(kk)] <= 0) continue;
      return t0 + (seconds_[size_t(kk)] - t0) / double(kk) * double(k);
    }
  }
  return t0 * (1.0 + kPriorSlope * double(k));
}

double DraftController::expected_speedup(int k) const {
  if (seconds_[0] <= 0) return 1.0;
  return tokens_per_step(acceptance(), k) * seconds_[0] / step_seconds(k);
}

int DraftController::choose(int room) {
  const int most = std::min(max_k_, room);
  if (most <= 0) return 0;
  if (!adaptive_) return most;
  if (seconds_[0] <= 0) return 0;  // a plain step first: the yardstick
  // drafting must promise kMargin over plain decoding: near the break-even the estimates' noise
  // would otherwise make it lose as often as it wins
  int best = 0;
  double best_rate = 1.0 + kMargin;
  for (int k = 1; k <= most; ++k) {
    const double rate = expected_speedup(k);
    if (rate > best_rate) best_rate = rate, best = k;
  }
  if (best > 0) {
    plain_steps_ = 0;
    probe_every_ = 16;
    return best;
  }
  if (++plain_steps_ < probe_every_) return 0;
  plain_steps_ = 0;
  probe_every_ = std::min(2 * probe_every_, kProbeMax);
  return 1;
}

void DraftController::record(int k, int accepted, double seconds) {
  if (k < 0 || k > max_k_) return;
  double& t = seconds_[size_t(k)];
  t = t > 0 ? (1 - kTimeWeight) * t + kTimeWeight * seconds : seconds;
  if (k == 0) return;
  accepted_ = kDecay * accepted_ + double(accepted);
  tried_ = kDecay * tried_ + double(accepted) + (accepted < k ? 1.0 : 0.0);
}

}  // namespace strata
