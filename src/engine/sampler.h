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

 private:
  SamplerParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
  std::vector<float> penalized_;
};

}  // namespace strata
