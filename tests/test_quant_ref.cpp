// Tests of the scalar quant reference (src/cpu/quant_ref.h, quant_traits.h) and of fp16.h.
//
// Independence: the expected values here are computed from the format definitions, not by calling
// the code under test. Blocks are built with encoders that follow ggml's writers
// (quantize_row_*_ref packing loops), the reference decodes with its readers, and the expected
// floats are computed in double with an explicit rounding to float at each step ggml rounds. On
// real llama.cpp files the same tensor is decoded from two quantizations of one float master.
//
// Randomness is fresh on every run; the seed is printed with every failure and can be replayed
// with STRATA_TEST_SEED=<seed>.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cpu/fp16.h"
#include "cpu/quant_blocks.h"
#include "cpu/quant_ref.h"
#include "cpu/quant_traits.h"
#include "model/gguf.h"
#include "test_support.h"

namespace strata {
namespace {

// ---------------------------------------------------------------------------------------------
// helpers

uint64_t test_seed() {
  static const uint64_t seed = [] {
    if (const char* env = std::getenv("STRATA_TEST_SEED"))
      return uint64_t(std::strtoull(env, nullptr, 10));
    std::random_device rd;
    return (uint64_t(rd()) << 32) ^ rd();
  }();
  return seed;
}

struct Rng {
  std::mt19937_64 gen;
  explicit Rng(uint64_t salt) : gen(test_seed() ^ (salt * 0x9E3779B97F4A7C15ull)) {}
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen); }
  float normal() { return std::normal_distribution<float>(0.0f, 1.0f)(gen); }
  int int_in(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); }
  uint8_t byte() { return uint8_t(int_in(0, 255)); }
  bool coin() { return int_in(0, 1) == 1; }
  // A finite fp16 scale, log-uniform in [2^-20, 2^-2] (subnormal halves included), random sign
  // when `signed_scale`.
  uint16_t half_scale(bool signed_scale) {
    float v = std::ldexp(1.0f, int_in(-20, -3)) * uniform(1.0f, 2.0f);
    if (signed_scale && coin()) v = -v;
    return f32_to_fp16(v);
  }
  // Random activations: normal, with an occasional outlier as real hidden states have.
  std::vector<float> activations(int64_t n) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = normal() * (int_in(0, 63) == 0 ? 8.0f : 1.0f);
    return x;
  }
};

#define SEED_TRACE() SCOPED_TRACE("STRATA_TEST_SEED=" + std::to_string(test_seed()))

float h2f(uint16_t h) {
  return fp16_to_f32(h);
}
// Correct rounding of a double to float: the reference for one IEEE float operation whose exact
// result the double holds.
float rf(double v) {
  return float(v);
}

void expect_bitwise_equal(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (f32_to_bits(got[i]) != f32_to_bits(want[i])) {
      ADD_FAILURE() << "element " << i << ": got " << got[i] << " (0x" << std::hex
                    << f32_to_bits(got[i]) << "), want " << want[i] << " (0x"
                    << f32_to_bits(want[i]) << std::dec << ")";
      return;
    }
  }
}

// The nibble packing of the 32-element formats, as ggml's writers do it: element j (0..15) in
// the low nibble of qs[j], element j + 16 in the high nibble.
void pack_nibbles_32(const int* q, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = uint8_t(q[j] | (q[j + 16] << 4));
}
// The fifth bits of Q5_0 / Q5_1 as ggml's writers do it: bit j of the uint32 qh.
void pack_qh_32(const int* q, uint8_t* qh_bytes) {
  uint32_t qh = 0;
  for (int j = 0; j < 32; ++j) qh |= uint32_t((q[j] >> 4) & 1) << j;
  std::memcpy(qh_bytes, &qh, 4);
}
// The 2-bit packing of Q2_K / Q3_K (ggml quantize_row_q2_K_ref):
// qs[j/4 + l] = L[j+l] | L[j+l+32] << 2 | L[j+l+64] << 4 | L[j+l+96] << 6 for j = 0, 128.
void pack_2bit_256(const int* L, uint8_t* qs) {
  for (int j = 0; j < 256; j += 128) {
    for (int l = 0; l < 32; ++l) {
      qs[j / 4 + l] = uint8_t((L[j + l] & 3) | ((L[j + l + 32] & 3) << 2) |
                              ((L[j + l + 64] & 3) << 4) | ((L[j + l + 96] & 3) << 6));
    }
  }
}
// The 6-bit scale / min packing of Q4_K / Q5_K (ggml quantize_row_q4_K_ref).
void pack_scales_k4(const int* ls, const int* lm, uint8_t* scales) {
  std::memset(scales, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      scales[j] = uint8_t(ls[j]);
      scales[j + 4] = uint8_t(lm[j]);
    } else {
      scales[j + 4] = uint8_t((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
      scales[j - 4] |= uint8_t((ls[j] >> 4) << 6);
      scales[j] |= uint8_t((lm[j] >> 4) << 6);
    }
  }
}
// The nibble packing of Q4_K / Q5_K (ggml): for j = 0, 64, 128, 192: q[l] = L[j+l] | L[j+l+32]
// << 4.
void pack_nibbles_256(const int* L, uint8_t* qs) {
  for (int j = 0; j < 256; j += 64) {
    for (int l = 0; l < 32; ++l)
      qs[j / 2 + l] = uint8_t((L[j + l] & 0xF) | ((L[j + l + 32] & 0xF) << 4));
  }
}

std::vector<int> random_ints(Rng& rng, int count, int lo, int hi) {
  std::vector<int> v(static_cast<size_t>(count));
  for (int& x : v) x = rng.int_in(lo, hi);
  return v;
}

// ---------------------------------------------------------------------------------------------
// fp16 / bf16 (fp16.h)

// Known values, both directions, and round-to-nearest-even at every kind of tie. Exact.
TEST(QuantFp16, KnownValuesAndTies) {
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    float f;
    uint16_t h;
  };
  const Case exact[] = {{0.0f, 0x0000},          {-0.0f, 0x8000},        {1.0f, 0x3c00},
                        {-2.0f, 0xc000},         {0.5f, 0x3800},         {65504.0f, 0x7bff},
                        {0x1p-14f, 0x0400},      {0x1p-24f, 0x0001},     {0x3ffp-24f, 0x03ff},
                        {inf, 0x7c00},           {-inf, 0xfc00},         {0.333251953125f, 0x3555},
                        {-0x1.ff8p-15f, 0x83ff}, {1.0009765625f, 0x3c01}};
  for (const Case& c : exact) {
    EXPECT_EQ(f32_to_fp16(c.f), c.h) << c.f;
    EXPECT_EQ(f32_to_bits(fp16_to_f32(c.h)), f32_to_bits(c.f)) << std::hex << c.h;
  }
  const Case rounded[] = {
      {1.0f + 0x1p-11f, 0x3c00},             // tie -> even (down)
      {1.0f + 3 * 0x1p-11f, 0x3c02},         // tie -> even (up)
      {1.0f + 0x1p-11f + 0x1p-20f, 0x3c01},  // just above the tie
      {65519.0f, 0x7bff},                    // below the midpoint to 2^16
      {65520.0f, 0x7c00},                    // the midpoint rounds to even: infinity
      {1e10f, 0x7c00},                       // overflow
      {0.5f * 0x1p-24f, 0x0000},             // subnormal tie -> even (zero)
      {0.75f * 0x1p-24f, 0x0001},            //
      {1.5f * 0x1p-24f, 0x0002},             // subnormal tie -> even (up)
      {2.5f * 0x1p-24f, 0x0002},             // subnormal tie -> even (down)
      {1023.5f * 0x1p-24f, 0x0400},          // tie between the largest subnormal and 2^-14
      {-0.25f * 0x1p-24f, 0x8000},           // underflow keeps the sign
      {1e-45f, 0x0000},                      // f32 subnormal
  };
  for (const Case& c : rounded) EXPECT_EQ(f32_to_fp16(c.f), c.h) << c.f;
  const uint16_t nan = f32_to_fp16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);
  EXPECT_TRUE(std::isnan(fp16_to_f32(0x7e00)));
  EXPECT_TRUE(std::isnan(fp16_to_f32(0xfc01)));
}

// Every half decodes to the value of the IEEE binary16 definition and encodes back to itself.
TEST(QuantFp16, AllHalvesRoundTrip) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = fp16_to_f32(uint16_t(h));
    const int sign = (h >> 15) ? -1 : 1, exp = (h >> 10) & 31, mant = h & 1023;
    if (exp == 31) {
      EXPECT_EQ(std::isnan(f), mant != 0) << h;
      EXPECT_EQ(f32_to_fp16(f) & 0xfc00, h & 0xfc00) << h;
      continue;
    }
    const double want = sign * (exp == 0 ? std::ldexp(double(mant), -24)
                                         : std::ldexp(1.0 + mant / 1024.0, exp - 15));
    ASSERT_EQ(double(f), want) << h;
    ASSERT_EQ(f32_to_fp16(f), h) << h;
  }
}

// Random floats across the whole half range (subnormals included) round to the nearest half,
// ties to the even one: checked against both neighbours in exact double arithmetic.
TEST(QuantFp16, RandomFloatsRoundToNearestEven) {
  SEED_TRACE();
  Rng rng(1);
  for (int i = 0; i < 200000; ++i) {
    float f = std::ldexp(rng.uniform(1.0f, 2.0f), rng.int_in(-27, 15));
    if (i % 4 == 0) {  // exact ties: a half plus half its ulp
      const uint16_t h = uint16_t(rng.int_in(0, 0x7bfe));
      f = float((double(fp16_to_f32(h)) + double(fp16_to_f32(uint16_t(h + 1)))) / 2);
    }
    if (std::fabs(f) >= 65504.0f) continue;
    if (rng.coin()) f = -f;
    const uint16_t h = f32_to_fp16(f);
    const uint16_t mag = h & 0x7fff;
    ASSERT_EQ(h >> 15, std::signbit(f) ? 1 : 0) << f;
    const double err = std::fabs(double(fp16_to_f32(h)) - f);
    for (int step : {-1, 1}) {
      const int nb = int(mag) + step;
      if (nb < 0 || nb > 0x7bff) continue;
      const double nb_err = std::fabs(double(fp16_to_f32(uint16_t((h & 0x8000) | nb))) - f);
      ASSERT_LE(err, nb_err) << f;
      if (err == nb_err) {
        ASSERT_EQ(mag & 1, 0) << "tie not to even: " << f;
      }
    }
  }
}

// bf16: known values and ties (exact), every bf16 round trips, random floats round to nearest even.
TEST(QuantBf16, KnownValuesRoundTripAndRounding) {
  SEED_TRACE();
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);                     // tie -> even (down)
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);                 // tie -> even (up)
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);          // above the tie
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to infinity
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x00008000u)), 0x0000);           // subnormal tie -> even
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x00018000u)), 0x0002);           // subnormal tie -> even (up)
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x80010000u)), 0x8001);           // subnormal kept, sign kept
  const uint16_t nan = f32_to_bf16(bits_to_f32(0x7f800001u));         // signalling NaN -> still NaN
  EXPECT_TRUE(std::isnan(bf16_to_f32(nan)));
  EXPECT_EQ(bf16_to_f32(0x4049), 3.140625f);

  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = bf16_to_f32(uint16_t(b));
    ASSERT_EQ(f32_to_bits(f), b << 16);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
    } else {
      ASSERT_EQ(f32_to_bf16(f), b);
    }
  }
  Rng rng(2);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t bits = uint32_t(rng.gen()) & 0x7effffffu;  // finite, below 2^126
    const float f = bits_to_f32(bits);
    const uint16_t h = f32_to_bf16(f);
    const double err = std::fabs(double(bf16_to_f32(h)) - f);
    for (int step : {-1, 1}) {
      const int nb = int(h) + step;
      if (nb < 0) continue;
      const double nb_err = std::fabs(double(bf16_to_f32(uint16_t(nb))) - f);
      ASSERT_LE(err, nb_err) << std::hex << bits;
      if (err == nb_err) {
        ASSERT_EQ(h & 1, 0) << std::hex << bits;
      }
    }
  }
}

// E8M0 half scale: 2^(e - 128) for every byte, subnormals included. Exact.
TEST(QuantMxfp4, E8M0HalfScaleEveryByte) {
  for (int e = 0; e < 256; ++e) {
    EXPECT_EQ(double(e8m0_to_f32_half(uint8_t(e))), std::ldexp(1.0, e - 128)) << e;
  }
}

// ---------------------------------------------------------------------------------------------
// dequantize: hand-built blocks against the format definitions. Tolerance: exact (bitwise).

constexpr int kBlocks32 = 64;  // blocks per row in the 32-element tests
constexpr int kBlocks256 = 8;  // super-blocks per row in the 256-element tests

TEST(QuantDequant, Q4_0FromDefinition) {
  SEED_TRACE();
  Rng rng(10);
  std::vector<block_q4_0> row(kBlocks32);
  std::vector<float> want;
  for (auto& b : row) {
    b.d = rng.half_scale(true);
    const auto q = random_ints(rng, 32, 0, 15);
    pack_nibbles_32(q.data(), b.qs);
    for (int e = 0; e < 32; ++e) want.push_back(rf(double(q[size_t(e)] - 8) * h2f(b.d)));
  }
  std::vector<float> got(want.size());
  ref::dequantize_row_q4_0(row.data(), got.data(), int64_t(got.size()));
  expect_bitwise_equal(got, want);
}

TEST(QuantDequant, Q4_1FromDefinition) {
  SEED_TRACE();
  Rng rng(11);
  std::vector<block_q4_1> row(kBlocks32);
  std::vector<float> want;
  for (auto& b : row) {
    b.d = rng.half_scale(false);
    b.m = rng.half_scale(true);
    const auto q = random_ints(rng, 32, 0, 15);
    pack_nibbles_32(q.data(), b.qs);
    // q * d rounded, then + m rounded (no fused multiply-add)
    for (int e = 0; e < 32; ++e)
      want.push_back(rf(double(rf(double(q[size_t(e)]) * h2f(b.d))) + h2f(b.m)));
  }
  std::vector<float> got(want.size());
  ref::dequantize_row_q4_1(row.data(), got.data(), int64_t(got.size()));
  expect_bitwise_equal(got, want);
}

TEST(QuantDequant, Q5_0FromDefinition) {
  SEED_TRACE();
  Rng rng(12);
  std::vector<block_q5_0> row(kBlocks32);
  std::vector<float> want;
  for (auto& b : row) {
    b.d = rng.half_scale(true);
    auto q = random_ints(rng, 32, 0, 31);
    std::vector<int> low(32);
    for (int e = 0; e < 32; ++e) low[size_t(e)] = q[size_t(e)] & 0xF;
    pack_nibbles_32(low.data(), b.qs);
    pack_qh_32(q.data(), b.qh);
    for (int e = 0; e < 32; ++e) want.push_back(rf(double(q[size_t(e)] - 16) * h2f(b.d)));
  }
  std::vector<float> got(want.size());
  ref::dequantize_row_q5_0(row.data(), got.data(), int64_t(got.size()));
  expect_bitwise_equal(got, want);
}

TEST(QuantDequant, Q5_1FromDefinition) {
  SEED_TRACE();
  Rng rng(13);
  std::vector<block_q5_1> row(kBlocks32);
  std::vector<float> want;
  for (auto& b : row) {
    b.d = rng.half_scale(false);
    b.m = rng.half_scale(true);
    auto q = random_ints(rng, 32, 0, 31);
    std::vector<int> low(32);
    for (int e = 0; e < 32; ++e) low[size_t(e)] = q[size_t(e)] & 0xF;
    pack_nibbles_32(low.data(), b.qs);
    pack_qh_32(q.data(), b.qh);
    for (int e = 0; e < 32; ++e)
      want.push_back(rf(double(rf(double(q[size_t(e)]) * h2f(b.d))) + h2f(b.m)));
  }
  std::vector<float> got(want.size());
  ref::dequantize_row_q5_1(row.data(), got.data(), int64_t(got.size()));
  expect_bitwise_equal(got, want);
}

TEST(QuantDequant, Q8_0FromDefinition) {
  SEED_TRACE();
  Rng rng(14);
  std::vector<block_q8_0> row(kBlocks32);
  std::vector<float> want;
  for (auto& b : row) {
    b.d = rng.half_scale(true);
    for (int e = 0; e < 32; ++e) {
      b.qs[e] = int8_t(rng.int_in(-128, 127));
      want.push_back(rf(double(b.qs[e]) * h2f(b.d)));
    }
  }
  std::vector<float> got(want.size());
  ref::dequantize_row_q8_0(row.data(), got.data(), int64_t(got.size()));
  expect_bitwise_equal(got, want);
}

TEST(QuantDequant, Iq4NlFromDefinition) {
  SEED_TRACE();
  Rng rng(15);
  const int table[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  std::vector<block_iq4_nl> row(kBlocks32);
  std::vector<float> want;
  for (auto& b : row) {
    b.d = rng.half_scale(true);
    const auto q = random_ints(rng, 32, 0, 15);
    pack_nibbles_32(q.data(), b.qs);
    for (int e = 0; e < 32; ++e) want.push_back(rf(double(h2f(b.d)) * table[q[size_t(e)]]));
  }
  std::vector<float> got(want.size());
  ref::dequantize_row_iq4_nl(row.data(), got.data(), int64_t(got.size()));
  expect_bitwise_equal(got, want);
}

TEST(QuantDequant, Mxfp4FromDefinition) {
  SEED_TRACE();
  Rng rng(16);
  // E2M1: sign bit 3, exponent bits 1..2, mantissa bit 0; value 0.5 * m for e = 0 (subnormal),
  // else 2^(e-1) * (1 + m / 2).
  auto e2m1 = [](int code) {
    const int e = (code >> 1) & 3, m = code & 1;
    const double mag = e == 0 ? 0.5 * m : std::ldexp(1.0 + 0.5 * m, e - 1);
    // code 8 is -0 in E2M1, but ggml's table (and so llama.cpp) decodes it as +0
    return (code & 8) && mag != 0 ? -mag : mag;
  };
  std::vector<block_mxfp4> row(kBlocks32 * 4);
  std::vector<float> want;
  int i = 0;
  for (auto& b : row) {
    b.e = uint8_t(i < 256 ? i : rng.int_in(0, 255));  // every exponent byte at least once
    ++i;
    const auto q = random_ints(rng, 32, 0, 15);
    pack_nibbles_32(q.data(), b.qs);
    for (int e = 0; e < 32; ++e)
      want.push_back(rf(e2m1(q[size_t(e)]) * std::ldexp(1.0, b.e - 127)));
  }
  std::vector<float> got(want.size());
  ref::dequantize_row_mxfp4(row.data(), got.data(), int64_t(got.size()));
  expect_bitwise_equal(got, want);
}

TEST(QuantDequant, Q2_KFromDefinition) {
  SEED_TRACE();
  Rng rng(20);
  std::vector<block_q2_K> row(kBlocks256);
  std::vector<float> want;
  for (auto& b : row) {
    b.d = rng.half_scale(false);
    b.dmin = rng.half_scale(false);
    const auto sc = random_ints(rng, 16, 0, 15), mn = random_ints(rng, 16, 0, 15);
    for (int j = 0; j < 16; ++j) b.scales[j] = uint8_t(sc[size_t(j)] | (mn[size_t(j)] << 4));
    const auto q = random_ints(rng, 256, 0, 3);
    pack_2bit_256(q.data(), b.qs);
    for (int e = 0; e < 256; ++e) {
      const float dl = rf(double(h2f(b.d)) * sc[size_t(e / 16)]);
      const float ml = rf(double(h2f(b.dmin)) * mn[size_t(e / 16)]);
      want.push_back(rf(double(rf(double(dl) * q[size_t(e)])) - ml));
    }
  }
  std::vector<float> got(want.size());
  ref::dequantize_row_q2_K(row.data(), got.data(), int64_t(got.size()));
  expect_bitwise_equal(got, want);
}

TEST(QuantDequant, Q3_KFromDefinition) {
  SEED_TRACE();
  Rng rng(21);
  std::vector<block_q3_K> row(kBlocks256);
  std::vector<float> want;
  for (auto& b : row) {
    b.d = rng.half_scale(true);
    const auto sc = random_ints(rng, 16, 0, 63);  // stored; used as sc - 32
    std::memset(b.scales, 0, 12);
    for (int j = 0; j < 16; ++j) {  // ggml quantize_row_q3_K_ref's packing
      int l = sc[size_t(j)];
      if (j < 8) {
        b.scales[j] = uint8_t(l & 0xF);
      } else {
        b.scales[j - 8] |= uint8_t((l & 0xF) << 4);
      }
      l >>= 4;
      b.scales[j % 4 + 8] |= uint8_t(l << (2 * (j / 4)));
    }
    const auto q3 = random_ints(rng, 256, -4, 3);
    std::vector<int> L(256);
    std::memset(b.hmask, 0, 32);
    int m = 0;
    uint8_t hm = 1;
    for (int j = 0; j < 256; ++j) {  // ggml's high-bit packing
      L[size_t(j)] = q3[size_t(j)] + 4;
      if (L[size_t(j)] > 3) {
        b.hmask[m] |= hm;
        L[size_t(j)] -= 4;
      }
      if (++m == 32) {
        m = 0;
        hm = uint8_t(hm << 1);
      }
    }
    pack_2bit_256(L.data(), b.qs);
    for (int e = 0; e < 256; ++e) {
      const float dl = rf(double(h2f(b.d)) * (sc[size_t(e / 16)] - 32));
      want.push_back(rf(double(dl) * q3[size_t(e)]));
    }
  }
  std::vector<float> got(want.size());
  ref::dequantize_row_q3_K(row.data(), got.data(), int64_t(got.size()));
  expect_bitwise_equal(got, want);
}

TEST(QuantDequant, Q4_KFromDefinition) {
  SEED_TRACE();
  Rng rng(22);
  std::vector<block_q4_K> row(kBlocks256);
  std::vector<float> want;
  for (auto& b : row) {
    b.d = rng.half_scale(false);
    b.dmin = rng.half_scale(false);
    const auto ls = random_ints(rng, 8, 0, 63), lm = random_ints(rng, 8, 0, 63);
    pack_scales_k4(ls.data(), lm.data(), b.scales);
    const auto q = random_ints(rng, 256, 0, 15);
    pack_nibbles_256(q.data(), b.qs);
    for (int e = 0; e < 256; ++e) {
      const float dl = rf(double(h2f(b.d)) * ls[size_t(e / 32)]);
      const float ml = rf(double(h2f(b.dmin)) * lm[size_t(e / 32)]);
      want.push_back(rf(double(rf(double(dl) * q[size_t(e)])) - ml));
    }
  }
  std::vector<float> got(want.size());
  ref::dequantize_row_q4_K(row.data(), got.data(), int64_t(got.size()));
  expect_bitwise_equal(got, want);
}

TEST(QuantDequant, Q5_KFromDefinition) {
  SEED_TRACE();
  Rng rng(23);
  std::vector<block_q5_K> row(kBlocks256);
  std::vector<float> want;
  for (auto& b : row) {
    b.d = rng.half_scale(false);
    b.dmin = rng.half_scale(false);
    const auto ls = random_ints(rng, 8, 0, 63), lm = random_ints(rng, 8, 0, 63);
    pack_scales_k4(ls.data(), lm.data(), b.scales);
    const auto q = random_ints(rng, 256, 0, 31);
    // ggml quantize_row_q5_K_ref's packing: fifth bits m1 = 1, m2 = 2, shifted by 2 per 64
    std::memset(b.qh, 0, 32);
    uint8_t* ql = b.qs;
    uint8_t m1 = 1, m2 = 2;
    for (int n = 0; n < 256; n += 64) {
      for (int j = 0; j < 32; ++j) {
        int l1 = q[size_t(n + j)], l2 = q[size_t(n + j + 32)];
        if (l1 > 15) {
          l1 -= 16;
          b.qh[j] |= m1;
        }
        if (l2 > 15) {
          l2 -= 16;
          b.qh[j] |= m2;
        }
        ql[j] = uint8_t(l1 | (l2 << 4));
      }
      m1 = uint8_t(m1 << 2);
      m2 = uint8_t(m2 << 2);
      ql += 32;
    }
    for (int e = 0; e < 256; ++e) {
      const float dl = rf(double(h2f(b.d)) * ls[size_t(e / 32)]);
      const float ml = rf(double(h2f(b.dmin)) * lm[size_t(e / 32)]);
      want.push_back(rf(double(rf(double(dl) * q[size_t(e)])) - ml));
    }
  }
  std::vector<float> got(want.size());
  ref::dequantize_row_q5_K(row.data(), got.data(), int64_t(got.size()));
  expect_bitwise_equal(got, want);
}

TEST(QuantDequant, Q6_KFromDefinition) {
  SEED_TRACE();
  Rng rng(24);
  std::vector<block_q6_K> row(kBlocks256);
  std::vector<float> want;
  for (auto& b : row) {
    b.d = rng.half_scale(true);
    for (int j = 0; j < 16; ++j) b.scales[j] = int8_t(rng.int_in(-128, 127));
    const auto q = random_ints(rng, 256, -32, 31);
    // ggml quantize_row_q6_K_ref's packing of L = q + 32
    uint8_t* ql = b.ql;
    uint8_t* qh = b.qh;
    for (int j = 0; j < 256; j += 128) {
      for (int l = 0; l < 32; ++l) {
        const int L0 = q[size_t(j + l)] + 32, L1 = q[size_t(j + l + 32)] + 32;
        const int L2 = q[size_t(j + l + 64)] + 32, L3 = q[size_t(j + l + 96)] + 32;
        ql[l] = uint8_t((L0 & 0xF) | ((L2 & 0xF) << 4));
        ql[l + 32] = uint8_t((L1 & 0xF) | ((L3 & 0xF) << 4));
        qh[l] = uint8_t((L0 >> 4) | ((L1 >> 4) << 2) | ((L2 >> 4) << 4) | ((L3 >> 4) << 6));
      }
      ql += 64;
      qh += 32;
    }
    for (int e = 0; e < 256; ++e) {
      const float dl = rf(double(h2f(b.d)) * b.scales[e / 16]);
      want.push_back(rf(double(dl) * q[size_t(e)]));
    }
  }
  std::vector<float> got(want.size());
  ref::dequantize_row_q6_K(row.data(), got.data(), int64_t(got.size()));
  expect_bitwise_equal(got, want);
}

TEST(QuantDequant, Q8_KFromDefinition) {
  SEED_TRACE();
  Rng rng(25);
  std::vector<block_q8_K> row(kBlocks256);
  std::vector<float> want;
  for (auto& b : row) {
    b.d = rng.normal() * 0.01f;
    for (int e = 0; e < 256; ++e) {
      b.qs[e] = int8_t(rng.int_in(-127, 127));
      want.push_back(rf(double(b.d) * b.qs[e]));
    }
  }
  std::vector<float> got(want.size());
  ref::dequantize_row_q8_K(row.data(), got.data(), int64_t(got.size()));
  expect_bitwise_equal(got, want);
}

TEST(QuantDequant, Iq4XsFromDefinition) {
  SEED_TRACE();
  Rng rng(26);
  const int table[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  std::vector<block_iq4_xs> row(kBlocks256);
  std::vector<float> want;
  for (auto& b : row) {
    b.d = rng.half_scale(true);
    const auto ls = random_ints(rng, 8, 0, 63);
    b.scales_h = 0;
    std::memset(b.scales_l, 0, 4);
    for (int ib = 0; ib < 8; ++ib) {  // ggml quantize_row_iq4_xs's packing
      b.scales_l[ib / 2] |= uint8_t((ls[size_t(ib)] & 0xF) << (4 * (ib % 2)));
      b.scales_h |= uint16_t((ls[size_t(ib)] >> 4) << (2 * ib));
    }
    const auto q = random_ints(rng, 256, 0, 15);
    for (int ib = 0; ib < 8; ++ib) pack_nibbles_32(&q[size_t(32 * ib)], &b.qs[16 * ib]);
    for (int e = 0; e < 256; ++e) {
      const float dl = rf(double(h2f(b.d)) * (ls[size_t(e / 32)] - 32));
      want.push_back(rf(double(dl) * table[q[size_t(e)]]));
    }
  }
  std::vector<float> got(want.size());
  ref::dequantize_row_iq4_xs(row.data(), got.data(), int64_t(got.size()));
  expect_bitwise_equal(got, want);
}

// F32 / F16 / BF16 rows decode element by element. Exact.
TEST(QuantDequant, FloatTypes) {
  SEED_TRACE();
  Rng rng(27);
  std::vector<float> x = rng.activations(1024);
  std::vector<uint16_t> h(x.size()), b(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    h[i] = f32_to_fp16(x[i]);
    b[i] = f32_to_bf16(x[i]);
  }
  std::vector<float> got(x.size()), want(x.size());
  ref::dequantize_row_f32(x.data(), got.data(), int64_t(x.size()));
  expect_bitwise_equal(got, x);
  for (size_t i = 0; i < x.size(); ++i) want[i] = fp16_to_f32(h[i]);
  ref::dequantize_row_f16(h.data(), got.data(), int64_t(x.size()));
  expect_bitwise_equal(got, want);
  for (size_t i = 0; i < x.size(); ++i) want[i] = bf16_to_f32(b[i]);
  ref::dequantize_row_bf16(b.data(), got.data(), int64_t(x.size()));
  expect_bitwise_equal(got, want);
}

// ---------------------------------------------------------------------------------------------
// activation quantizers

// Q8_0: per element |x - q * d32| <= d32 / 2 with d32 = amax / 127 the scale the quants were made
// with, plus the float rounding of x * (1 / d32): the reciprocal and the product, each within
// 2^-24 relative of a value up to 127.5 steps, so at most 128 * 2^-23 of a step (a seed once
// found 1.4e-6 of a half step, past the 1e-6 this allowed before); with the stored fp16 scale the
// bound is that plus 127 * |d32 - d16|. The amax element quantizes to +-127. Ties round away
// from zero.
TEST(QuantActivations, Q8_0WithinHalfAStep) {
  SEED_TRACE();
  Rng rng(30);
  for (int64_t n : {32, 256, 4096}) {
    std::vector<float> x = rng.activations(n);
    std::vector<block_q8_0> q(static_cast<size_t>(n / 32));
    ref::quantize_row_q8_0(x.data(), q.data(), n);
    for (int64_t ib = 0; ib < n / 32; ++ib) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[size_t(ib * 32 + j)]));
      const double d32 = double(amax / 127.0f), d16 = h2f(q[size_t(ib)].d);
      EXPECT_EQ(q[size_t(ib)].d, f32_to_fp16(amax / 127.0f));
      int qmax = 0;
      for (int j = 0; j < 32; ++j) {
        const double xi = x[size_t(ib * 32 + j)], qi = q[size_t(ib)].qs[j];
        qmax = std::max(qmax, std::abs(int(qi)));
        const double slack = d32 * 128 * std::ldexp(1.0, -23);
        EXPECT_LE(std::fabs(xi - qi * d32), d32 * 0.5 + slack) << ib << " " << j;
        EXPECT_LE(std::fabs(xi - qi * d16), d32 * 0.5 + slack + 127 * std::fabs(d32 - d16));
      }
      EXPECT_EQ(qmax, 127);
    }
  }
  // ties: amax 127 gives d = 1, so x = k + 0.5 is an exact tie; roundf goes away from zero
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = float(j % 8) - 3.5f;  // -3.5 .. 3.5
  x[31] = 127.0f;
  block_q8_0 b;
  ref::quantize_row_q8_0(x, &b, 32);
  EXPECT_EQ(h2f(b.d), 1.0f);
  for (int j = 0; j < 31; ++j)
    EXPECT_EQ(b.qs[j], int(std::copysign(std::fabs(x[j]) + 0.5f, x[j]))) << x[j];
  // a block of zeros
  float zeros[32] = {};
  ref::quantize_row_q8_0(zeros, &b, 32);
  EXPECT_EQ(b.d, 0);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(b.qs[j], 0);
}

// Q8_1: same quants and scale as Q8_0; s = fp16(d32 * sum(q)). Exact.
TEST(QuantActivations, Q8_1SumMatchesQuants) {
  SEED_TRACE();
  Rng rng(31);
  const int64_t n = 1024;
  std::vector<float> x = rng.activations(n);
  std::vector<block_q8_0> q0(static_cast<size_t>(n / 32));
  std::vector<block_q8_1> q1(static_cast<size_t>(n / 32));
  ref::quantize_row_q8_0(x.data(), q0.data(), n);
  ref::quantize_row_q8_1(x.data(), q1.data(), n);
  for (size_t ib = 0; ib < q1.size(); ++ib) {
    EXPECT_EQ(q1[ib].d, q0[ib].d);
    EXPECT_EQ(std::memcmp(q1[ib].qs, q0[ib].qs, 32), 0);
    int sum = 0;
    float amax = 0;
    for (int j = 0; j < 32; ++j) {
      sum += q1[ib].qs[j];
      amax = std::max(amax, std::fabs(x[ib * 32 + size_t(j)]));
    }
    EXPECT_EQ(q1[ib].s, f32_to_fp16(float(sum) * (amax / 127.0f)));
  }
}

// Q8_K: with max the element of largest magnitude, d = 1 / (-127 / max), so d has the opposite
// sign of max and max quantizes to -127; per element |x - q * d| <= |d| / 2 (+1e-5 relative for
// the float products); bsums are the exact sums of 16 quants; ties round to even (not away from
// zero as Q8_0 does). A zero block is all zero, bsums included.
TEST(QuantActivations, Q8_KWithinHalfAStepAndBsums) {
  SEED_TRACE();
  Rng rng(32);
  for (int64_t n : {256, 4096}) {
    std::vector<float> x = rng.activations(n);
    std::vector<block_q8_K> q(static_cast<size_t>(n / 256));
    ref::quantize_row_q8_K(x.data(), q.data(), n);
    for (size_t ib = 0; ib < q.size(); ++ib) {
      const float* xb = &x[ib * 256];
      float max = 0;
      for (int j = 0; j < 256; ++j) {
        if (std::fabs(xb[j]) > std::fabs(max)) max = xb[j];
      }
      EXPECT_EQ(q[ib].d, 1.0f / (-127.0f / max));
      const double d = q[ib].d;
      EXPECT_LT(d * max, 0.0);
      for (int j = 0; j < 256; ++j) {
        ASSERT_LE(std::fabs(xb[j] - q[ib].qs[j] * d), std::fabs(d) * (0.5 + 1e-5)) << j;
        if (xb[j] == max) {
          EXPECT_EQ(q[ib].qs[j], -127);
        }
      }
      for (int g = 0; g < 16; ++g) {
        int sum = 0;
        for (int j = 0; j < 16; ++j) sum += q[ib].qs[16 * g + j];
        EXPECT_EQ(q[ib].bsums[g], sum) << g;
      }
    }
  }
  // ties: max = -127 gives iscale = 1, so k + 0.5 is an exact tie; nearest_int goes to even
  float x[256] = {};
  for (int j = 0; j < 255; ++j) x[j] = float(j % 8) - 3.5f;
  x[255] = -127.0f;
  block_q8_K b;
  ref::quantize_row_q8_K(x, &b, 256);
  EXPECT_EQ(b.d, 1.0f);
  for (int j = 0; j < 255; ++j) EXPECT_EQ(b.qs[j], int(std::nearbyint(x[j]))) << x[j];
  EXPECT_EQ(b.qs[0], -4);  // -3.5 -> -4 (even), not -3
  EXPECT_EQ(b.qs[1], -2);  // -2.5 -> -2
  float zeros[256] = {};
  std::memset(&b, 0x55, sizeof(b));
  ref::quantize_row_q8_K(zeros, &b, 256);
  EXPECT_EQ(b.d, 0.0f);
  for (int j = 0; j < 256; ++j) EXPECT_EQ(b.qs[j], 0);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(b.bsums[j], 0);
}

// ---------------------------------------------------------------------------------------------
// dot products

// A random weight row of `type`: random bytes (every bit pattern of the quants is valid) with the
// fp16 / E8M0 scales replaced by sane finite values.
std::vector<uint8_t> random_weight_row(Rng& rng, GgmlType type, int64_t n) {
  const QuantTraits& t = quant_traits(type);
  std::vector<uint8_t> bytes(static_cast<size_t>(n / t.block_size * t.type_size));
  for (auto& b : bytes) b = rng.byte();
  const size_t nb = size_t(n / t.block_size);
  auto set_half = [&](size_t block, size_t offset, bool signed_scale) {
    const uint16_t h = rng.half_scale(signed_scale);
    std::memcpy(&bytes[block * t.type_size + offset], &h, 2);
  };
  for (size_t i = 0; i < nb; ++i) {
    switch (type) {
      case GgmlType::f32: {
        const float v = rng.normal();
        std::memcpy(&bytes[i * 4], &v, 4);
        break;
      }
      case GgmlType::f16:
        set_half(i, 0, true);
        break;
      case GgmlType::bf16: {
        const uint16_t h = f32_to_bf16(rng.normal());
        std::memcpy(&bytes[i * 2], &h, 2);
        break;
      }
      case GgmlType::q4_0:
        set_half(i, offsetof(block_q4_0, d), true);
        break;
      case GgmlType::q5_0:
        set_half(i, offsetof(block_q5_0, d), true);
        break;
      case GgmlType::q8_0:
        set_half(i, offsetof(block_q8_0, d), true);
        break;
      case GgmlType::iq4_nl:
        set_half(i, offsetof(block_iq4_nl, d), true);
        break;
      case GgmlType::q4_1:
        set_half(i, offsetof(block_q4_1, d), false);
        set_half(i, offsetof(block_q4_1, m), true);
        break;
      case GgmlType::q5_1:
        set_half(i, offsetof(block_q5_1, d), false);
        set_half(i, offsetof(block_q5_1, m), true);
        break;
      case GgmlType::q2_k:
        set_half(i, offsetof(block_q2_K, d), false);
        set_half(i, offsetof(block_q2_K, dmin), false);
        break;
      case GgmlType::q3_k:
        set_half(i, offsetof(block_q3_K, d), true);
        break;
      case GgmlType::q4_k:
        set_half(i, offsetof(block_q4_K, d), false);
        set_half(i, offsetof(block_q4_K, dmin), false);
        break;
      case GgmlType::q5_k:
        set_half(i, offsetof(block_q5_K, d), false);
        set_half(i, offsetof(block_q5_K, dmin), false);
        break;
      case GgmlType::q6_k:
        set_half(i, offsetof(block_q6_K, d), true);
        break;
      case GgmlType::iq4_xs:
        set_half(i, offsetof(block_iq4_xs, d), true);
        break;
      case GgmlType::mxfp4:
        bytes[i * t.type_size] = uint8_t(rng.int_in(110, 130));
        break;
      default:
        ADD_FAILURE() << "no random row for " << t.name;
    }
  }
  return bytes;
}

// Q4_1 / Q5_1 take their min term as m_w * s_a, where s_a = fp16(d32 * sum q_a) is rounded on
// its own, not as m_w * sum(d16 * q_a) of the dequantized activations. Returns the difference
// sum over blocks of m_w * (s_a - d16 * sum q_a), and in *abs the sum of its magnitudes.
double q8_1_min_term_correction(GgmlType type, const uint8_t* w, const uint8_t* a, int64_t n,
                                double* abs) {
  *abs = 0;
  if (type != GgmlType::q4_1 && type != GgmlType::q5_1) return 0;
  static_assert(offsetof(block_q4_1, m) == offsetof(block_q5_1, m));
  const size_t w_bytes = quant_traits(type).type_size;
  const auto* act = reinterpret_cast<const block_q8_1*>(a);
  double c = 0;
  for (int64_t b = 0; b < n / 32; ++b) {
    uint16_t m;
    std::memcpy(&m, w + size_t(b) * w_bytes + offsetof(block_q4_1, m), 2);
    int sum = 0;
    for (int j = 0; j < 32; ++j) sum += act[b].qs[j];
    const double term = double(h2f(m)) * (double(h2f(act[b].s)) - double(h2f(act[b].d)) * sum);
    c += term;
    *abs += std::fabs(term);
  }
  return c;
}

const GgmlType kComputable[] = {
    GgmlType::f32,  GgmlType::f16,    GgmlType::bf16,   GgmlType::q4_0,
    GgmlType::q4_1, GgmlType::q5_0,   GgmlType::q5_1,   GgmlType::q8_0,
    GgmlType::q2_k, GgmlType::q3_k,   GgmlType::q4_k,   GgmlType::q5_k,
    GgmlType::q6_k, GgmlType::iq4_nl, GgmlType::iq4_xs, GgmlType::mxfp4};

// The reference dot computes sum_i w_i * a_i of the dequantized weights and dequantized
// activations (Q4_1 / Q5_1: with the min term from the stored activation sums, see above):
// |ref - that sum (in double)| <= 5e-7 * sum_i |w_i * a_i| (float rounding of the per-block
// scaling and the float accumulation over at most 128 blocks; observed <= 4e-8, while one wrong
// element of 4096 moves the sum by about 2.5e-4 of it). The float types take float
// activations and round the double sum once: equal to vec_dot_exact rounded to float.
TEST(QuantDot, IntegerDotEqualsDequantizedProducts) {
  SEED_TRACE();
  Rng rng(40);
  for (GgmlType type : kComputable) {
    const QuantTraits& t = quant_traits(type);
    SCOPED_TRACE(std::string(t.name));
    for (int64_t n : {256, 1024, 4096}) {
      for (int rep = 0; rep < 4; ++rep) {
        const std::vector<uint8_t> w = random_weight_row(rng, type, n);
        const std::vector<float> x = rng.activations(n);
        if (t.vec_dot_type == GgmlType::f32) {
          const float got = t.vec_dot(n, w.data(), x.data());
          EXPECT_EQ(got, float(vec_dot_exact(type, n, w.data(), x.data())));
          continue;
        }
        const QuantTraits& at = quant_traits(t.vec_dot_type);
        std::vector<uint8_t> a(static_cast<size_t>(n / at.block_size * at.type_size));
        t.quantize_activation(x.data(), a.data(), n);
        std::vector<float> wd(static_cast<size_t>(n)), ad(static_cast<size_t>(n));
        t.dequantize_row(w.data(), wd.data(), n);
        at.dequantize_row(a.data(), ad.data(), n);
        double want = 0, mag = 0;
        for (int64_t i = 0; i < n; ++i) {
          want += double(wd[size_t(i)]) * ad[size_t(i)];
          mag += std::fabs(double(wd[size_t(i)]) * ad[size_t(i)]);
        }
        double unused;
        want += q8_1_min_term_correction(type, w.data(), a.data(), n, &unused);
        const float got = t.vec_dot(n, w.data(), a.data());
        ASSERT_LE(std::fabs(got - want), 5e-7 * mag)
            << "n=" << n << " got " << got << " want " << want;
      }
    }
  }
}

// Against float math on the unquantized activations: the only extra error is the activation
// quantization, so |ref - sum_i w_i * x_i| <= sum_i |w_i| * |x_i - xq_i| (+ the Q4_1 / Q5_1 min
// term's rounding, + 5e-7 * sum |w_i x_i|), and in relative terms < 1e-2 * |w| * |x| (observed
// about 2e-4 on average for 8-bit activations of normal data).
TEST(QuantDot, WithinActivationQuantizationErrorOfFloatDot) {
  SEED_TRACE();
  Rng rng(41);
  for (GgmlType type : kComputable) {
    const QuantTraits& t = quant_traits(type);
    if (t.vec_dot_type == GgmlType::f32) continue;
    SCOPED_TRACE(std::string(t.name));
    const QuantTraits& at = quant_traits(t.vec_dot_type);
    for (int64_t n : {256, 2048}) {
      for (int rep = 0; rep < 8; ++rep) {
        const std::vector<uint8_t> w = random_weight_row(rng, type, n);
        const std::vector<float> x = rng.activations(n);
        std::vector<uint8_t> a(static_cast<size_t>(n / at.block_size * at.type_size));
        t.quantize_activation(x.data(), a.data(), n);
        std::vector<float> wd(static_cast<size_t>(n)), xq(static_cast<size_t>(n));
        t.dequantize_row(w.data(), wd.data(), n);
        at.dequantize_row(a.data(), xq.data(), n);
        double bound = 0, mag = 0, w2 = 0, x2 = 0;
        for (size_t i = 0; i < size_t(n); ++i) {
          bound += std::fabs(double(wd[i])) * std::fabs(double(x[i]) - xq[i]);
          mag += std::fabs(double(wd[i]) * x[i]);
          w2 += double(wd[i]) * wd[i];
          x2 += double(x[i]) * x[i];
        }
        double min_term_error;
        q8_1_min_term_correction(type, w.data(), a.data(), n, &min_term_error);
        bound += min_term_error;
        const double exact = vec_dot_exact(type, n, w.data(), x.data());
        const float got = t.vec_dot(n, w.data(), a.data());
        EXPECT_LE(std::fabs(got - exact), bound + 5e-7 * mag) << "n=" << n;
        EXPECT_LT(std::fabs(got - exact), 1e-2 * std::sqrt(w2 * x2)) << "n=" << n;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// traits table

TEST(QuantTraits, GeometryMatchesGgmlTable) {
  const std::map<GgmlType, size_t> block_bytes = {{GgmlType::q4_0, sizeof(block_q4_0)},
                                                  {GgmlType::q4_1, sizeof(block_q4_1)},
                                                  {GgmlType::q5_0, sizeof(block_q5_0)},
                                                  {GgmlType::q5_1, sizeof(block_q5_1)},
                                                  {GgmlType::q8_0, sizeof(block_q8_0)},
                                                  {GgmlType::q8_1, sizeof(block_q8_1)},
                                                  {GgmlType::q2_k, sizeof(block_q2_K)},
                                                  {GgmlType::q3_k, sizeof(block_q3_K)},
                                                  {GgmlType::q4_k, sizeof(block_q4_K)},
                                                  {GgmlType::q5_k, sizeof(block_q5_K)},
                                                  {GgmlType::q6_k, sizeof(block_q6_K)},
                                                  {GgmlType::q8_k, sizeof(block_q8_K)},
                                                  {GgmlType::iq4_nl, sizeof(block_iq4_nl)},
                                                  {GgmlType::iq4_xs, sizeof(block_iq4_xs)},
                                                  {GgmlType::mxfp4, sizeof(block_mxfp4)},
                                                  {GgmlType::f32, 4},
                                                  {GgmlType::f16, 2},
                                                  {GgmlType::bf16, 2}};
  for (const GgmlTypeTraits& g : kGgmlTypeTable) {
    const QuantTraits& t = quant_traits(g.type);
    SCOPED_TRACE(std::string(g.name));
    EXPECT_EQ(t.type, g.type);
    EXPECT_EQ(t.name, g.name);
    EXPECT_EQ(t.block_size, g.block_size);
    EXPECT_EQ(t.type_size, g.type_size);
    if (t.dequantize_row != nullptr) {
      ASSERT_TRUE(block_bytes.count(g.type));
      EXPECT_EQ(block_bytes.at(g.type), g.type_size);
    }
  }
}

// Which types compute, with which activation format (ggml's vec_dot_type, f32 for float weights).
TEST(QuantTraits, SupportedTypesAndActivationFormats) {
  const std::map<GgmlType, GgmlType> want = {
      {GgmlType::f32, GgmlType::f32},     {GgmlType::f16, GgmlType::f32},
      {GgmlType::bf16, GgmlType::f32},    {GgmlType::q4_0, GgmlType::q8_0},
      {GgmlType::q4_1, GgmlType::q8_1},   {GgmlType::q5_0, GgmlType::q8_0},
      {GgmlType::q5_1, GgmlType::q8_1},   {GgmlType::q8_0, GgmlType::q8_0},
      {GgmlType::q2_k, GgmlType::q8_k},   {GgmlType::q3_k, GgmlType::q8_k},
      {GgmlType::q4_k, GgmlType::q8_k},   {GgmlType::q5_k, GgmlType::q8_k},
      {GgmlType::q6_k, GgmlType::q8_k},   {GgmlType::iq4_nl, GgmlType::q8_0},
      {GgmlType::iq4_xs, GgmlType::q8_k}, {GgmlType::mxfp4, GgmlType::q8_0}};
  for (const GgmlTypeTraits& g : kGgmlTypeTable) {
    const QuantTraits& t = quant_traits(g.type);
    SCOPED_TRACE(std::string(g.name));
    EXPECT_EQ(t.supported, want.count(g.type) == 1);
    const Status s = check_weight_type(g.type, "blk.0.ffn_up_exps.weight");
    EXPECT_EQ(s.ok(), t.supported);
    if (!t.supported) {
      EXPECT_EQ(t.vec_dot, nullptr);
      EXPECT_EQ(
          s.error().message.rfind("tensor blk.0.ffn_up_exps.weight has type " +
                                      std::string(g.name) + ", which strata cannot compute yet",
                                  0),
          0u)
          << s.error().message;
      continue;
    }
    EXPECT_EQ(t.vec_dot_type, want.at(g.type));
    EXPECT_NE(t.dequantize_row, nullptr);
    EXPECT_NE(t.vec_dot, nullptr);
    EXPECT_EQ(t.quantize_activation == nullptr, t.vec_dot_type == GgmlType::f32);
    if (t.vec_dot_type != GgmlType::f32) {
      EXPECT_EQ(t.block_size % quant_traits(t.vec_dot_type).block_size, 0u);
    }
  }
  // the activation formats decode and encode but are not weights
  for (GgmlType act : {GgmlType::q8_1, GgmlType::q8_k}) {
    EXPECT_NE(quant_traits(act).dequantize_row, nullptr);
    EXPECT_NE(quant_traits(act).from_float, nullptr);
  }
  const Status s = check_weight_type(GgmlType::iq2_xxs, "blk.3.ffn_down_exps.weight");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("iq2_xxs"), std::string::npos);
  EXPECT_NE(s.error().message.find("q4_K"), std::string::npos);  // lists what does compute
}

// ---------------------------------------------------------------------------------------------
// real llama.cpp files

// Element-wise decoders written from the format definitions (one element at a time, the
// positions computed from the element index), used to check the reference on real blocks.
struct ElementDecoders {
  static int q4k_scale(const uint8_t* s, int j) {  // 6-bit scale of sub-block j
    return j < 4 ? (s[j] & 63) : ((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
  }
  static int q4k_min(const uint8_t* s, int j) {
    return j < 4 ? (s[j + 4] & 63) : ((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
  static int q4k_nibble(const uint8_t* qs, int e) {
    return (qs[32 * (e / 64) + e % 32] >> (4 * ((e / 32) % 2))) & 0xF;
  }
};

struct TensorValues {
  GgmlType type;
  std::vector<float> values;
};

// Dequantizes a whole tensor with the traits table (rows are contiguous whole blocks).
TensorValues dequantize_tensor(const GgufFile& f, const GgufTensorInfo& t) {
  const QuantTraits& q = quant_traits(t.type);
  TensorValues out{t.type, std::vector<float>(static_cast<size_t>(t.n_elements()))};
  EXPECT_NE(q.dequantize_row, nullptr) << t.name;
  if (q.dequantize_row)
    q.dequantize_row(f.tensor_data(t).data(), out.values.data(), int64_t(t.n_elements()));
  return out;
}

// The vendored qwen3moe Q4_K_M model (always present): every tensor dequantizes to finite values
// with sane statistics; Q4_K, Q5_K, Q6_K and Q8_0 tensors are all present; on every real block the
// reference equals the element-wise decoder (exact); and the blocks show the invariants of
// llama.cpp's reference quantizers, which a misread scale would break: every Q4_K / Q5_K block's
// largest 6-bit scale is 63 (and largest min 63 when dmin > 0), every Q6_K block has a scale of
// -128, every Q8_0 block has a quant of magnitude 127.
TEST(QuantRealData, VendoredModelDecodes) {
  const auto path = test::data_dir() / "models" / "qwen3moe" / "model-Q4_K_M.gguf";
  auto f = GgufFile::open(path.string());
  ASSERT_TRUE(f.ok()) << f.error().message;
  std::set<GgmlType> seen;
  for (const GgufTensorInfo& t : f->tensors()) {
    SCOPED_TRACE(t.name);
    ASSERT_TRUE(check_weight_type(t.type, t.name).ok());
    seen.insert(t.type);
    const TensorValues v = dequantize_tensor(*f, t);
    double sum = 0, sum2 = 0;
    for (float x : v.values) {
      ASSERT_TRUE(std::isfinite(x));
      sum += x;
      sum2 += double(x) * x;
    }
    const double n = double(v.values.size()), mean = sum / n, rms = std::sqrt(sum2 / n);
    EXPECT_GT(rms, 1e-3);
    EXPECT_LT(rms, 10.0);
    if (t.type != GgmlType::f32) {
      EXPECT_LT(std::fabs(mean), 0.2 * rms) << "mean " << mean << " rms " << rms;
    }

    const uint8_t* data = f->tensor_data(t).data();
    const size_t nb = size_t(t.n_elements() / quant_traits(t.type).block_size);
    if (t.type == GgmlType::q4_k || t.type == GgmlType::q5_k) {
      const size_t bytes = quant_traits(t.type).type_size;
      for (size_t i = 0; i < nb; ++i) {
        // the two formats share d, dmin, scales at the same offsets, and the 4-bit qs layout
        const uint8_t* blk = data + i * bytes;
        uint16_t d, dmin;
        std::memcpy(&d, blk, 2);
        std::memcpy(&dmin, blk + 2, 2);
        const uint8_t* scales = blk + 4;
        const uint8_t* qs =
            blk + (t.type == GgmlType::q4_k ? offsetof(block_q4_K, qs) : offsetof(block_q5_K, qs));
        const uint8_t* qh = t.type == GgmlType::q5_k ? blk + offsetof(block_q5_K, qh) : nullptr;
        int max_sc = 0, max_m = 0;
        for (int j = 0; j < 8; ++j) {
          max_sc = std::max(max_sc, ElementDecoders::q4k_scale(scales, j));
          max_m = std::max(max_m, ElementDecoders::q4k_min(scales, j));
        }
        if (h2f(d) != 0) {
          ASSERT_EQ(max_sc, 63) << "block " << i;
        }
        if (h2f(dmin) > 0) {
          ASSERT_EQ(max_m, 63) << "block " << i;
        }
        for (int e = 0; e < 256; ++e) {
          int q = ElementDecoders::q4k_nibble(qs, e);
          if (qh) q += ((qh[e % 32] >> (e / 32)) & 1) * 16;
          const float dl = rf(double(h2f(d)) * ElementDecoders::q4k_scale(scales, e / 32));
          const float ml = rf(double(h2f(dmin)) * ElementDecoders::q4k_min(scales, e / 32));
          ASSERT_EQ(v.values[i * 256 + size_t(e)], rf(double(rf(double(dl) * q)) - ml))
              << "block " << i << " e " << e;
        }
      }
    } else if (t.type == GgmlType::q6_k) {
      const auto* blocks = reinterpret_cast<const block_q6_K*>(data);
      for (size_t i = 0; i < nb; ++i) {
        const block_q6_K& b = blocks[i];
        ASSERT_EQ(*std::min_element(b.scales, b.scales + 16), -128) << "block " << i;
        for (int e = 0; e < 256; ++e) {
          // 6-bit value: row-of-128 r = e / 128, column c = e % 128; low bits in ql[64 r + c % 64]
          // (nibble c / 64), high bits in qh[32 r + c % 32] (bits 2 * (c / 32))
          const int r = e / 128, c = e % 128;
          const int low = (b.ql[64 * r + c % 64] >> (4 * (c / 64))) & 0xF;
          const int high = (b.qh[32 * r + c % 32] >> (2 * (c / 32))) & 3;
          const float dl = rf(double(h2f(b.d)) * b.scales[e / 16]);
          ASSERT_EQ(v.values[i * 256 + size_t(e)], rf(double(dl) * ((low | (high << 4)) - 32)))
              << "block " << i << " e " << e;
        }
      }
    } else if (t.type == GgmlType::q8_0) {
      const auto* blocks = reinterpret_cast<const block_q8_0*>(data);
      for (size_t i = 0; i < nb; ++i) {
        int qmax = 0;
        for (int j = 0; j < 32; ++j) {
          qmax = std::max(qmax, std::abs(int(blocks[i].qs[j])));
          ASSERT_EQ(v.values[i * 32 + size_t(j)], rf(double(blocks[i].qs[j]) * h2f(blocks[i].d)));
        }
        if (blocks[i].d != 0) {
          ASSERT_EQ(qmax, 127) << "block " << i;
        }
      }
    }
  }
  for (GgmlType want :
       {GgmlType::q4_k, GgmlType::q5_k, GgmlType::q6_k, GgmlType::q8_0, GgmlType::f32}) {
    EXPECT_TRUE(seen.count(want)) << ggml_type_name(want);
  }
}

// The fixtures quantize one float master several ways, so a tensor dequantized from any file must
// match the same tensor of model-Q8_0.gguf up to the quantization error of its type; a layout bug
// decorrelates them. Bounds on the relative RMS difference ||a - b|| / ||b||, about 1.5 times the
// worst tensor of the fixture set (in brackets; the fixtures are fixed, Gaussian weights):
// q4_0 < 0.13 [0.087], q4_K < 0.11 [0.074], q5_0 < 0.065 [0.043], q5_K < 0.055 [0.037],
// q6_K < 0.03 [0.019], mxfp4 < 0.18 [0.119]; correlation > 0.99 for all.
// The same comparison against the next row of the Q8_0 tensor must fail (correlation < 0.5).
TEST(QuantRealData, FixturesAgreeWithQ8_0) {
  auto dir = test::fixtures_dir();
  if (!dir) GTEST_SKIP() << "../shared/fixtures not found: cross-quantization check skipped";
  const std::map<GgmlType, double> max_rel_rms = {{GgmlType::q4_0, 0.13},  {GgmlType::q4_k, 0.11},
                                                  {GgmlType::q5_0, 0.065}, {GgmlType::q5_k, 0.055},
                                                  {GgmlType::q6_k, 0.03},  {GgmlType::mxfp4, 0.18}};
  std::map<GgmlType, double> worst;
  for (const auto& model : test::fixture_models()) {
    if (model.filename() == "model-Q8_0.gguf") continue;
    const auto ref_path = model.parent_path() / "model-Q8_0.gguf";
    auto f = GgufFile::open(model.string());
    auto r = GgufFile::open(ref_path.string());
    ASSERT_TRUE(f.ok()) << f.error().message;
    ASSERT_TRUE(r.ok()) << r.error().message;
    for (const GgufTensorInfo& t : f->tensors()) {
      const GgufTensorInfo* rt = r->find_tensor(t.name);
      if (rt == nullptr || rt->type != GgmlType::q8_0 || t.type == GgmlType::q8_0 ||
          t.type == GgmlType::f32) {
        continue;
      }
      SCOPED_TRACE(model.string() + ": " + t.name + " (" + std::string(ggml_type_name(t.type)) +
                   ")");
      ASSERT_TRUE(max_rel_rms.count(t.type)) << "no bound for this type";
      ASSERT_EQ(t.n_elements(), rt->n_elements());
      const std::vector<float> a = dequantize_tensor(*f, t).values;
      const std::vector<float> b = dequantize_tensor(*r, *rt).values;
      auto compare = [](const float* x, const float* y, size_t n, double* rel_rms, double* corr) {
        double sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0, d2 = 0;
        for (size_t i = 0; i < n; ++i) {
          sx += x[i], sy += y[i], sxx += double(x[i]) * x[i], syy += double(y[i]) * y[i];
          sxy += double(x[i]) * y[i], d2 += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
        }
        *rel_rms = std::sqrt(d2 / syy);
        const double cov = sxy - sx * sy / n;
        *corr = cov / std::sqrt((sxx - sx * sx / n) * (syy - sy * sy / n));
      };
      double rel_rms, corr;
      compare(a.data(), b.data(), a.size(), &rel_rms, &corr);
      EXPECT_LT(rel_rms, max_rel_rms.at(t.type));
      EXPECT_GT(corr, 0.99);
      worst[t.type] = std::max(worst[t.type], rel_rms);
      // negative control: shifted by one row the same statistic sees no agreement
      const size_t row = size_t(t.ne[0]);
      if (a.size() >= 2 * row) {
        double bad_rms, bad_corr;
        compare(a.data(), b.data() + row, a.size() - row, &bad_rms, &bad_corr);
        EXPECT_LT(bad_corr, 0.5);
      }
    }
  }
  for (GgmlType want : {GgmlType::q4_0, GgmlType::q4_k, GgmlType::q5_0, GgmlType::q5_k,
                        GgmlType::q6_k, GgmlType::mxfp4}) {
    EXPECT_TRUE(worst.count(want)) << "no fixture tensor of type " << ggml_type_name(want);
  }
  for (const auto& [type, rms] : worst) {
    std::printf("  %-6s worst relative RMS vs Q8_0: %.4f\n",
                std::string(ggml_type_name(type)).c_str(), rms);
  }
}

}  // namespace
}  // namespace strata
