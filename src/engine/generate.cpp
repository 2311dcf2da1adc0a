#include "engine/generate.h"

#include <algorithm>
#include <chrono>

#include "engine/text_stream.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

Result<GenerateResult> generate(Session& session, const Tokenizer& tok, Sampler& sampler,
                                std::span<const TokenId> prompt, std::vector<TokenId>& history,
                                const GenerateOptions& opt,
                                const std::function<void(std::string_view)>& on_text) {
  GenerateResult r;
  r.n_prompt = int(prompt.size());
  const auto t0 = Clock::now();
  auto logits = session.eval(prompt);
  if (!logits) return logits.error();
  r.prefill_seconds = seconds_since(t0);
  history.insert(history.end(), prompt.begin(), prompt.end());

  TextStream stream(opt.stop);
  // Takes a sampled token as output; true when generation ends with it. The session holds every
  // output token but the last (as plain decoding leaves it).
  auto emit = [&](TokenId t) {
    if (!opt.ignore_eos && tok.is_eog(t)) {
      r.stop_reason = "end of generation";
      return true;
    }
    ++r.n_generated;
    history.push_back(t);
    if (const std::string_view text = stream.push(tok.token_to_piece(t, false)); !text.empty()) on_text(text);
    if (stream.stopped()) {
      r.stop_reason = "stop string";
      return true;
    }
    return r.n_generated >= opt.n_predict;
  };
  DraftController control(std::min(opt.max_draft, session.max_speculation() - 1), opt.adaptive_draft);
  const size_t V = size_t(session.model().hparams().n_vocab);

  const auto t1 = Clock::now();
  TokenId next = sampler.sample(*logits, history);
  bool done = opt.n_predict <= 0 || emit(next);
  while (!done) {
    if (session.n_past() >= session.n_ctx()) {
      r.stop_reason = "context full";
      break;
    }
    // drafts must fit the context and be worth producing (the token after the last is free)
    const int room = int(std::min<int64_t>(session.n_ctx() - session.n_past() - 1, opt.n_predict - r.n_generated - 1));
    const int k = opt.drafter != nullptr ? control.choose(room) : 0;
    const auto ts = Clock::now();  // a step's time includes drafting (the MTP drafter runs a layer)
    std::vector<TokenId> drafts = k > 0 ? opt.drafter->draft(history, k) : std::vector<TokenId>{};
    if (drafts.size() > size_t(k)) drafts.resize(size_t(k));  // a drafter's excess would not fit
    ++r.n_steps;
    if (drafts.empty()) {
      logits = session.eval(std::span<const TokenId>(&next, 1));
      if (!logits) return logits.error();
      next = sampler.sample(*logits, history);
      if (opt.drafter != nullptr) control.record(0, 0, seconds_since(ts));
      done = emit(next);
      continue;
    }
    // one eval of next and the drafts; row i of the logits follows drafts[0 .. i)
    const int64_t pos0 = session.n_past();
    std::vector<TokenId> batch{next};
    batch.insert(batch.end(), drafts.begin(), drafts.end());
    session.begin_speculation();
    auto rows = session.eval(batch, true);
    if (!rows) return rows.error();
    const int n_draft = int(drafts.size());
    int accepted = 0;
    bool rejected = false;
    for (; accepted < n_draft; ++accepted) {
      bool ok = false;
      const std::span<const float> row(rows->data() + size_t(accepted) * V, V);
      next = sampler.verify(row, history, drafts[size_t(accepted)], ok);
      if (!ok) {
        rejected = true;
        break;
      }
      if (emit(next)) {
        done = true;
        break;
      }
    }
    if (!rejected && !done) next = sampler.sample(std::span<const float>(rows->data() + size_t(n_draft) * V, V), history);
    // keep next and the accepted drafts, less the last output when generation ended on a draft
    session.rewind(pos0 + 1 + accepted);
    control.record(n_draft, accepted, seconds_since(ts));
    r.n_drafted += n_draft;
    r.n_accepted += accepted;
    if (!done) done = emit(next);
  }
  if (const std::string_view rest = stream.flush(); !rest.empty()) on_text(rest);
  r.text = stream.text();
  r.decode_seconds = seconds_since(t1);
  return r;
}

}  // namespace strata
