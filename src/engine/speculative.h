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
#include "model/kv_cache.h"
#include "model/tokenizer.h"

namespace strata {

class Session;

// Proposes tokens. A drafter sees the token history; one that needs more (the MTP drafter reads
// the target session's hidden rows, a separate draft model would keep a session of its own) holds
// that state itself.
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

// Drafts with the model's own multi-token-prediction layer (Model::mtp). The first draft comes
// from the target's hidden row of the last evaluated position and the pending token; each further
// one from the MTP layer's own output row and the draft before it (DeepSeek-V3's MTP module
// chained, as vLLM and SGLang run it). The MTP layer's cache holds one entry per target position
// q, made from h_q and token q+1; those entries are exact (the target's rows of accepted tokens),
// and the chained entries past them are overwritten at the next call. Drafts are the argmax of the
// MTP logits (a point-mass draft distribution, as Sampler::verify assumes).
class MtpDrafter final : public Drafter {
 public:
  // Turns on the target's hidden rows (Session::keep_hidden); create it before the target
  // evaluates the prompt. Errors: the model has no usable MTP layer (Model::mtp_error).
  static Result<std::unique_ptr<MtpDrafter>> create(Session& target);
  ~MtpDrafter() override;
  std::string name() const override { return "mtp"; }
  // history: every token the target has evaluated, then the pending one (n_past() + 1 tokens).
  std::vector<TokenId> draft(std::span<const TokenId> history, int k) override;
  // The MTP logits of the last call's first draft ([n_vocab]; tests).
  const std::vector<float>& first_logits() const { return first_logits_; }

 private:
  explicit MtpDrafter(Session& target);
  Session& target_;
  KvCache cache_;
  int64_t n_exact_ = 0;  // MTP entries 0 .. n_exact_ - 1 are made from the target's rows
  std::vector<float> first_logits_;
};

// "none" -> null, "ngram" -> NgramDrafter, "mtp" -> MtpDrafter on `target` (required for it).
// Errors name the unknown drafter, or say why the model cannot draft with MTP.
Result<std::unique_ptr<Drafter>> make_drafter(const std::string& name, Session* target = nullptr);
// make_drafter's name check alone (before a model is loaded).
Status check_drafter_name(const std::string& name);

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
