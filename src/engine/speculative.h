// Speculative decoding (docs/speculative.md): a drafter guesses the next tokens, one batched eval
// verifies them together (each expert's weights read once for every drafted token routed to it),
// the accepted prefix is kept and the rest rewound. generate() runs the loop; this file holds the
// drafters and the controller that chooses how many tokens to draft.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/error.h"
#include "model/tokenizer.h"

namespace strata {

// Proposes tokens. A drafter sees only the token history: a separate draft model or the model's
// own MTP layers (which also need the target's hidden states) would implement the same call with
// state of their own.
class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual std::string name() const = 0;
  // Up to k tokens likely to follow `history` (every token of the sequence; the last one is the
  // next to be evaluated). Fewer, or none, when it has no guess.
  virtual std::vector<TokenId> draft(std::span<const TokenId> history, int k) = 0;
};

// Prompt lookup (n-gram) drafting, no extra weights: the longest suffix of the history of
// min_n..max_n tokens that occurred before; proposes what followed its latest earlier occurrence.
// Pays on text that repeats its context: code edits, summaries, quoting, structured output.
class NgramDrafter final : public Drafter {
 public:
  explicit NgramDrafter(int min_n = 2, int max_n = 4) : min_n_(min_n), max_n_(max_n) {}
  std::string name() const override { return "ngram"; }
  std::vector<TokenId> draft(std::span<const TokenId> history, int k) override;

 private:
  int min_n_, max_n_;
};

// "none" -> null, "ngram" -> NgramDrafter. "mtp" is an error that says it is not built. Errors
// name the unknown drafter.
Result<std::unique_ptr<Drafter>> make_drafter(const std::string& name);

// Expected tokens a step with k drafts produces at per-token acceptance a: the accepted run plus
// the token after it, (1 - a^(k+1)) / (1 - a).
double tokens_per_step(double a, int k);

// Chooses k, the number of tokens to draft, at each step: the k that maximises the expected tokens
// per step, (1 - a^(k+1)) / (1 - a) for a per-token acceptance rate a, over the measured time of a
// step of k+1 tokens. a is the decayed ratio of accepted drafts to drafts tried (a rejection ends a
// step's tries); step times are decayed means per k, k never measured estimated from the nearest
// measured one (or, before any, as one plain step plus 30% of one per drafted token). A k must
// promise 3% over plain decoding. When k = 0 wins the drafter is off, but tried with k = 1 now and
// then (every 16 steps, the interval doubling up to 256 while it keeps losing) so that a change in
// acceptance is noticed.
class DraftController {
 public:
  explicit DraftController(int max_k, bool adaptive = true);
  // k for the next step, at most `room`.
  int choose(int room);
  // A step that drafted k tokens, of which `accepted` were kept, took `seconds` (eval and verify).
  void record(int k, int accepted, double seconds);
  double acceptance() const { return tried_ > 0 ? accepted_ / tried_ : 0.0; }
  // The expected tokens per second of k-token steps at the current estimates, relative to plain
  // decoding (1: as fast).
  double expected_speedup(int k) const;

 private:
  double step_seconds(int k) const;
  int max_k_;
  bool adaptive_;
  double accepted_ = 0.5, tried_ = 1;     // decayed counts; the prior is a = 0.5, worth one try
  std::vector<double> seconds_;           // [k] decayed mean step time, 0: not measured
  int plain_steps_ = 0, probe_every_ = 16;
};

}  // namespace strata
