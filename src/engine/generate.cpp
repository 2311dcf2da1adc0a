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
  const auto t1 = Clock::now();
  while (r.n_generated < opt.n_predict) {
    const TokenId next = sampler.sample(*logits, history);
    if (!opt.ignore_eos && tok.is_eog(next)) {
      r.stop_reason = "end of generation";
      break;
    }
    ++r.n_generated;
    history.push_back(next);
    if (const std::string_view text = stream.push(tok.token_to_piece(next, false)); !text.empty()) on_text(text);
    if (stream.stopped()) {
      r.stop_reason = "stop string";
      break;
    }
    if (r.n_generated == opt.n_predict) break;
    if (session.n_past() >= session.n_ctx()) {
      r.stop_reason = "context full";
      break;
    }
    logits = session.eval(std::span<const TokenId>(&next, 1));
    if (!logits) return logits.error();
  }
  if (const std::string_view rest = stream.flush(); !rest.empty()) on_text(rest);
  r.text = stream.text();
  r.decode_seconds = seconds_since(t1);
  return r;
}

}  // namespace strata
