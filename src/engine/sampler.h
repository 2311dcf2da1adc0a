// Picks the next token from logits. In order: repetition penalty over the last `penalty_last_n`
// tokens (llama.cpp's rule: a positive logit is divided by the penalty, a negative one multiplied),
// then greedy at temperature 0, else top-k, softmax at the temperature, top-p (nucleus) and min-p
// (drop tokens below min_p times the best probability), and a draw from a seeded generator, so a
// seed reproduces a run.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace strata {

struct SamplerParams {
  float temperature = 0.0f;  // <= 0: greedy (argmax, ties to the lowest id)
  int top_k = 40;            // <= 0: all tokens
  float top_p = 0.95f;       // >= 1: no nucleus cut
  float min_p = 0.05f;        // <= 0: off
  float repeat_penalty = 1.0f;  // 1: off
  int penalty_last_n = 64;
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplerParams& p) : p_(p), rng_(p.seed) {}
  // `history`: the tokens so far (prompt and generated), for the repetition penalty.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history = {});
  // Speculative decoding's accept/reject step for a drafted token (a deterministic draft: the
  // draft distribution is all on `draft`). Greedy: accepted when the draft is the argmax, which is
  // returned either way. Sampling (the rule of Leviathan et al. 2023 with that draft): accepted
  // with the probability p(draft) of the distribution sample() draws from; otherwise a token drawn
  // from p without the draft, renormalised. Either way the token returned is distributed as
  // sample()'s. Sets `accepted`.
  int32_t verify(std::span<const float> logits, std::span<const int32_t> history, int32_t draft, bool& accepted);

 private:
  // Applies the repetition penalty; greedy: returns the argmax. Otherwise leaves the distribution
  // in cand_[0 .. keep) (weights, not normalised, most likely first), returns -1 and sets total.
  int32_t distribution(std::span<const float> logits, std::span<const int32_t> history, size_t& keep, double& total);
  // A draw from cand_[0 .. keep) with weight `total`, skipping token `skip` (-1: none).
  int32_t draw(size_t keep, double total, int32_t skip);
  SamplerParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
  std::vector<float> penalized_;
};

}  // namespace strata
