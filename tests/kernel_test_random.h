// Fresh random data and block layouts for the kernel tests (test_simd_kernels.cpp,
// test_gemm_kernels.cpp): one seed per test process, printed with every failure (SEED_TRACE) and
// replayable with STRATA_TEST_SEED=<seed>; an Rng per test, salted so tests do not share
// streams; where each format keeps its scales.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cpu/fp16.h"
#include "cpu/quant_blocks.h"
#include "cpu/ggml_type.h"

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

inline bool has_mins(GgmlType t) { return t == GgmlType::q4_k || t == GgmlType::q5_k; }

// Where the scales of a block are, and how they are drawn.
struct ScaleFields {
  size_t d = 0;            // offset of the fp16 scale (or the E8M0 byte of mxfp4)
  size_t dmin = SIZE_MAX;  // offset of the fp16 min scale (Q4_K / Q5_K)
  bool signed_scale = true;
};
inline ScaleFields scale_fields(GgmlType t) {
  switch (t) {
    case GgmlType::q4_0: return {offsetof(block_q4_0, d)};
    case GgmlType::q5_0: return {offsetof(block_q5_0, d)};
    case GgmlType::q8_0: return {offsetof(block_q8_0, d)};
    case GgmlType::iq4_nl: return {offsetof(block_iq4_nl, d)};
    case GgmlType::mxfp4: return {offsetof(block_mxfp4, e)};
    case GgmlType::q4_k: return {offsetof(block_q4_K, d), offsetof(block_q4_K, dmin), false};
    case GgmlType::q5_k: return {offsetof(block_q5_K, d), offsetof(block_q5_K, dmin), false};
    case GgmlType::q6_k: return {offsetof(block_q6_K, d)};
    default: ADD_FAILURE() << "no scale layout for type " << int(t); return {};
  }
}

}  // namespace strata
