// SplitMix64 (Steele, Lea, Flood 2014): the one small seeded mixer the project uses wherever it
// needs reproducible pseudo-random numbers without a standard distribution (whose output differs
// between standard libraries): fault injection, synthetic weights, trace mapping.
#pragma once

#include <cstdint>

namespace strata {

// SplitMix64's output function: a bijective 64-bit mixer.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// One SplitMix64 step from state x: a well-mixed hash of x.
inline uint64_t splitmix64(uint64_t x) { return mix64(x + 0x9e3779b97f4a7c15ull); }

}  // namespace strata
