// Fresh random data for the kernel tests (test_simd_kernels.cpp, test_gemm_kernels.cpp): one
// seed per test process, printed with every failure (SEED_TRACE) and replayable with
// STRATA_TEST_SEED=<seed>; an Rng per test, salted so tests do not share streams.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cpu/fp16.h"

namespace strata {

inline uint64_t test_seed() {
  static const uint64_t seed = [] {
    if (const char* env = std::getenv("STRATA_TEST_SEED")) return uint64_t(std::strtoull(env, nullptr, 10));
    std::random_device rd;
    return (uint64_t(rd()) << 32) ^ rd();
  }();
  return seed;
}

#define SEED_TRACE() SCOPED_TRACE("STRATA_TEST_SEED=" + std::to_string(test_seed()))

struct Rng {
  std::mt19937_64 gen;
  explicit Rng(uint64_t salt) : gen(test_seed() ^ (salt * 0x9E3779B97F4A7C15ull)) {}
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen); }
  float normal() { return std::normal_distribution<float>(0.0f, 1.0f)(gen); }
  int int_in(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); }
  uint8_t byte() { return uint8_t(int_in(0, 255)); }
  // A finite fp16 scale, log-uniform in [2^-20, 2^-2] (subnormal halves included), random sign
  // when `signed_scale`.
  uint16_t half_scale(bool signed_scale) {
    float v = std::ldexp(1.0f, int_in(-20, -3)) * uniform(1.0f, 2.0f);
    if (signed_scale && int_in(0, 1)) v = -v;
    return f32_to_fp16(v);
  }
  // Activations: normal, with an occasional outlier as real hidden states have.
  std::vector<float> activations(int64_t n) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = normal() * (int_in(0, 63) == 0 ? 8.0f : 1.0f);
    return x;
  }
};

}  // namespace strata
