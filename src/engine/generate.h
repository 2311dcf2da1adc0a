// The generation loop shared by `strata run`, `strata chat` (and the server): evaluate new prompt
// tokens, then sample and evaluate one token at a time, streaming text as it becomes final.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "engine/speculative.h"
#include "model/tokenizer.h"

namespace strata {

struct GenerateOptions {
  int n_predict = 128;            // most tokens to generate
  std::vector<std::string> stop;  // stop when the output contains one (not included in the text)
  bool ignore_eos = false;        // keep going past end-of-generation tokens
  // Speculative decoding (null: off): tokens drafted by `drafter` are verified in one eval of up
  // to max_draft + 1 tokens; with adaptive_draft the number drafted follows DraftController,
  // else it is always max_draft (benchmarks). The output is as without it: the same tokens with
  // greedy sampling, the same distribution otherwise.
  Drafter* drafter = nullptr;
  int max_draft = 8;
  bool adaptive_draft = true;
};

struct GenerateResult {
  std::string text;            // generated text, cut at a stop string
  int n_prompt = 0;            // tokens evaluated before the first sample
  int n_generated = 0;
  double prefill_seconds = 0;  // time to first token
  double decode_seconds = 0;
  const char* stop_reason = "length";  // "length", "end of generation", "stop string", "context full"
  // speculative decoding: evals during decode, tokens drafted and drafts accepted
  int n_steps = 0, n_drafted = 0, n_accepted = 0;
};

// Evaluates `prompt` (tokens not yet in the session) and generates. `history` holds every token the
// session has seen (for the repetition penalty) and is extended with what is generated.
// `on_text` receives the text in order, held back only while it may still turn into a stop string
// or is an incomplete UTF-8 sequence.
Result<GenerateResult> generate(Session& session, const Tokenizer& tok, Sampler& sampler,
                                std::span<const TokenId> prompt, std::vector<TokenId>& history,
                                const GenerateOptions& opt,
                                const std::function<void(std::string_view)>& on_text);

}  // namespace strata
