#include "engine/generate.h"

#include <algorithm>
#include <chrono>

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Bytes of `text` that form complete UTF-8 sequences (a trailing partial one is left out).
size_t complete_utf8_prefix(const std::string& text) {
  for (size_t back = 1; back <= std::min<size_t>(3, text.size()); ++back) {
    const unsigned char c = static_cast<unsigned char>(text[text.size() - back]);
    if ((c & 0xC0) == 0xC0) {
      const size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
      return back < need ? text.size() - back : text.size();
    }
    if ((c & 0x80) == 0) break;
  }
  return text.size();
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

  size_t emitted = 0;  // bytes of r.text passed to on_text
  const auto t1 = Clock::now();
  while (r.n_generated < opt.n_predict) {
    const TokenId next = sampler.sample(*logits, history);
    if (!opt.ignore_eos && tok.is_eog(next)) {
      r.stop_reason = "end of generation";
      break;
    }
    ++r.n_generated;
    history.push_back(next);
    r.text += tok.token_to_piece(next, false);

    size_t end = complete_utf8_prefix(r.text);
    bool stopped = false;
    for (const std::string& st : opt.stop) {
      if (st.empty()) continue;
      const size_t from = emitted > st.size() ? emitted - st.size() : 0;
      const size_t at = r.text.find(st, from);
      if (at != std::string::npos) {
        r.text.resize(at);
        end = at;
        stopped = true;
      }
    }
    // hold back a tail that is a prefix of a stop string
    size_t hold = 0;
    if (!stopped) {
      for (const std::string& st : opt.stop)
        for (size_t k = std::min(st.empty() ? 0 : st.size() - 1, end); k > hold; --k)
          if (r.text.compare(end - k, k, st, 0, k) == 0) hold = k;
    }
    if (end - hold > emitted) {
      on_text(std::string_view(r.text).substr(emitted, end - hold - emitted));
      emitted = end - hold;
    }
    if (stopped) {
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
  if (r.text.size() > emitted) on_text(std::string_view(r.text).substr(emitted));
  r.decode_seconds = seconds_since(t1);
  return r;
}

}  // namespace strata
