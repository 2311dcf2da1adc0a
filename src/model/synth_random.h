// The random numbers of `strata synth` (internal to src/model/synth*.cpp). SplitMix64 streams
// keyed by a hash of (seed, what, where), so every piece of a synthetic model is reproducible on
// its own, whatever order or thread produces it.
#pragma once

#include <cstdint>

#include "base/hash.h"

namespace strata::synth_random {

using strata::mix64;

// A stream keyed by (seed, a, b): different keys give unrelated streams.
class Rng {
 public:
  Rng(uint64_t seed, uint64_t a, uint64_t b) : state_(mix64(mix64(mix64(seed) + a) + b)) {}

  uint64_t next() { return mix64(state_ += 0x9e3779b97f4a7c15ull); }
  // Uniform in [0, 1).
  float uniform() { return float(next() >> 40) * (1.0f / 16777216.0f); }
  // Approximately N(0, 1): the sum of four uniform 16-bit draws (Irwin-Hall), centred and scaled.
  // Bounded by +-3.5; plenty for random weights, and one draw per value.
  float normal() {
    const uint64_t x = next();
    const float sum =
        float(x & 0xffff) + float((x >> 16) & 0xffff) + float((x >> 32) & 0xffff) + float(x >> 48);
    return (sum * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
  }

 private:
  uint64_t state_;
};

}  // namespace strata::synth_random
