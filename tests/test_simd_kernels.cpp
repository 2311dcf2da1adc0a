// The SIMD kernel variants (src/cpu/kernels.h, src/cpu/avx2, src/cpu/avx512) against the scalar
// reference (quant_ref.h) on fresh random data, for every ISA this CPU supports; an ISA it lacks
// is skipped with a message. Also the start-up dispatch.
//
// What is compared, and how closely:
//  - activation quantizers (Q8_0, Q8_K): bit-identical blocks, on random rows and on rows built to
//    hit the rounding ties and the sign rule of each format;
//  - dot products with power-of-two scales and small activation quants, where every float
//    operation of both the reference and the variant is exact: bit-identical results (any wrong
//    element shows);
//  - dot products on random rows with random activations quantized by the reference: the integer
//    sums are the same, only the order of the float scaling and accumulation differs, so
//      |simd - ref| <= 2 (nb + 16) 2^-24 M,
//    with nb the number of blocks and M = sum_i |w_i| |a_i| of the dequantized weights and
//    activations (Q4_K / Q5_K: the scale and min parts of w_i counted separately); this is the
//    worst-case float error of two sums of nb + 16 rounded terms of total magnitude <= M;
//  - F16 / BF16 weights against float activations: every product is exact in float (FMA), the
//    variants sum them in at least 32 float lanes (n / 32 terms each, then a reduction tree), the
//    reference in double rounded once to float; the same bound holds with nb = n / 32;
//  - the same on rows of extreme quants (all at their largest magnitude), which would show a
//    saturating 16-bit intermediate.
//
// Randomness is fresh on every run; the seed is printed with every failure and can be replayed
// with STRATA_TEST_SEED=<seed>.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/fp16.h"
#include "kernel_test_random.h"
#include "cpu/kernels.h"
#include "cpu/ops.h"
#include "cpu/quant_blocks.h"
#include "cpu/quant_traits.h"

namespace strata {
namespace {

using cpu::CpuIsa;
using cpu::KernelTable;


// The ISAs with SIMD variants; each test runs those the CPU supports.
const CpuIsa kSimdIsas[] = {CpuIsa::avx2, CpuIsa::avx512};

// Weight types with SIMD variants (the same list drives bench/bench_matvec.cpp).
const GgmlType kSimdTypes[] = {GgmlType::q4_0,  GgmlType::q5_0, GgmlType::q8_0, GgmlType::iq4_nl,
                               GgmlType::mxfp4, GgmlType::q4_k, GgmlType::q5_k, GgmlType::q6_k,
                               GgmlType::f16,   GgmlType::bf16};

const int64_t kLengths[] = {256, 1024, 4096, 11008};  // 11008 = 43 * 256: not a power of two
// Extra lengths for the 32-element formats, whose kernels take blocks four at a time: 1, 3 and
// 67 blocks leave every remainder of that.
const int64_t kShortLengths[] = {32, 96, 2144};
// Extra lengths for F16 / BF16 (any n): every remainder of the 16- and 64-element steps, and none.
const int64_t kFloatLengths[] = {0, 1, 7, 15, 33, 100, 4097};

bool is_float16(GgmlType t) { return t == GgmlType::f16 || t == GgmlType::bf16; }

std::vector<int64_t> lengths_for(GgmlType type, std::initializer_list<int64_t> base) {
  std::vector<int64_t> v(base);
  if (quant_traits(type).block_size == 32) v.insert(v.end(), std::begin(kShortLengths), std::end(kShortLengths));
  if (is_float16(type)) v.insert(v.end(), std::begin(kFloatLengths), std::end(kFloatLengths));
  return v;
}

uint16_t to_float16(GgmlType t, float v) { return t == GgmlType::f16 ? f32_to_fp16(v) : f32_to_bf16(v); }

void put_half(std::vector<uint8_t>& row, size_t offset, uint16_t h) { std::memcpy(&row[offset], &h, 2); }

// A random weight row: random quant bytes (every bit pattern is a valid quant), random valid
// scales. Q6_K's int8 sub-block scales are random too (-128..127).
std::vector<uint8_t> random_weight_row(Rng& rng, GgmlType type, int64_t n) {
  const QuantTraits& t = quant_traits(type);
  const size_t nb = size_t(n / t.block_size);
  std::vector<uint8_t> row(nb * t.type_size);
  if (is_float16(type)) {
    // F16 / BF16: finite values of widely spread magnitudes (F16 subnormals below 2^-14 included)
    const int lo = type == GgmlType::f16 ? -20 : -40, hi = type == GgmlType::f16 ? 4 : 40;
    for (size_t i = 0; i < nb; ++i) put_half(row, 2 * i, to_float16(type, std::ldexp(rng.normal(), rng.int_in(lo, hi))));
    return row;
  }
  for (auto& b : row) b = rng.byte();
  const ScaleFields f = scale_fields(type);
  for (size_t i = 0; i < nb; ++i) {
    const size_t base = i * t.type_size;
    if (type == GgmlType::mxfp4) {
      row[base + f.d] = uint8_t(rng.int_in(110, 130));
      continue;
    }
    put_half(row, base + f.d, rng.half_scale(f.signed_scale));
    if (f.dmin != SIZE_MAX) put_half(row, base + f.dmin, rng.half_scale(false));
  }
  return row;
}

// Every quant at its largest magnitude (most negative where the format is signed), the packed
// sub-block scales at their largest, random scales; F16 / BF16: every value a large negative one.
std::vector<uint8_t> extreme_weight_row(Rng& rng, GgmlType type, int64_t n) {
  std::vector<uint8_t> row = random_weight_row(rng, type, n);
  const QuantTraits& t = quant_traits(type);
  const size_t nb = size_t(n / t.block_size);
  for (size_t i = 0; i < nb; ++i) {
    uint8_t* b = row.data() + i * t.type_size;
    switch (type) {
      // F16: the largest finite value; BF16: -2^100 (its largest would overflow the float sum)
      case GgmlType::f16: put_half(row, 2 * i, 0xFBFF); break;
      case GgmlType::bf16: put_half(row, 2 * i, 0xF180); break;
      case GgmlType::q4_0: std::memset(reinterpret_cast<block_q4_0*>(b)->qs, 0x00, 16); break;  // -8
      case GgmlType::q5_0: {
        auto* q = reinterpret_cast<block_q5_0*>(b);  // nibble 0, fifth bit 0: -16
        std::memset(q->qs, 0x00, 16);
        std::memset(q->qh, 0x00, 4);
        break;
      }
      case GgmlType::q8_0: std::memset(reinterpret_cast<block_q8_0*>(b)->qs, 0x80, 32); break;  // -128
      case GgmlType::iq4_nl: std::memset(reinterpret_cast<block_iq4_nl*>(b)->qs, 0x00, 16); break;  // -127
      case GgmlType::mxfp4: std::memset(reinterpret_cast<block_mxfp4*>(b)->qs, 0xFF, 16); break;  // -12
      case GgmlType::q4_k: {
        auto* q = reinterpret_cast<block_q4_K*>(b);
        std::memset(q->scales, 0xFF, 12);  // every scale and min 63
        std::memset(q->qs, 0xFF, 128);    // 15
        break;
      }
      case GgmlType::q5_k: {
        auto* q = reinterpret_cast<block_q5_K*>(b);
        std::memset(q->scales, 0xFF, 12);
        std::memset(q->qs, 0xFF, 128);
        std::memset(q->qh, 0xFF, 32);  // 31
        break;
      }
      case GgmlType::q6_k: {
        auto* q = reinterpret_cast<block_q6_K*>(b);
        std::memset(q->ql, 0x00, 128);  // stored 0: -32
        std::memset(q->qh, 0x00, 64);
        std::memset(q->scales, 0x80, 16);  // -128
        break;
      }
      default: ADD_FAILURE() << "no extreme row for " << t.name;
    }
  }
  return row;
}

std::vector<uint8_t> quantize_reference(GgmlType act_type, const std::vector<float>& x) {
  const QuantTraits& at = quant_traits(act_type);
  std::vector<uint8_t> a(x.size() / at.block_size * at.type_size);
  at.from_float(x.data(), a.data(), int64_t(x.size()));
  return a;
}

std::vector<float> dequantize(GgmlType type, const std::vector<uint8_t>& row, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n));
  quant_traits(type).dequantize_row(row.data(), y.data(), n);
  return y;
}

// M = sum_i |w_i| |a_i| (see the top of the file). Q4_K / Q5_K count the scale part
// (d * sc * q: the row with dmin = 0) and the min part (dmin * m: the row with d = 0) apart.
double magnitude(GgmlType type, const std::vector<uint8_t>& w, const std::vector<uint8_t>& a, int64_t n) {
  const QuantTraits& t = quant_traits(type);
  const std::vector<float> ad = dequantize(t.vec_dot_type, a, n);
  std::vector<std::vector<float>> parts;
  if (has_mins(type)) {
    const ScaleFields f = scale_fields(type);
    std::vector<uint8_t> scale_part = w, min_part = w;
    for (size_t i = 0; i < size_t(n / t.block_size); ++i) {
      put_half(scale_part, i * t.type_size + f.dmin, 0);
      put_half(min_part, i * t.type_size + f.d, 0);
    }
    parts.push_back(dequantize(type, scale_part, n));
    parts.push_back(dequantize(type, min_part, n));
  } else {
    parts.push_back(dequantize(type, w, n));
  }
  double m = 0;
  for (const auto& wd : parts)
    for (size_t i = 0; i < size_t(n); ++i) m += std::fabs(double(wd[i])) * std::fabs(double(ad[i]));
  return m;
}

double float_tolerance(GgmlType type, int64_t n, double magnitude) {
  const double nb = is_float16(type) ? double(n / 32) : double(n / quant_traits(type).block_size);
  return 2.0 * (nb + 16.0) * std::ldexp(1.0, -24) * magnitude + 1e-30;
}

// Runs `body(table)` for every SIMD ISA the CPU supports; skips the test when it supports none.
template <class Body>
void for_each_isa(Body body) {
  int ran = 0;
  for (CpuIsa isa : kSimdIsas) {
    if (!cpu::isa_supported(isa)) continue;
    SCOPED_TRACE("isa " + std::string(cpu::isa_name(isa)));
    body(cpu::cpu_kernels(isa));
    ++ran;
  }
  if (ran == 0) GTEST_SKIP() << "this CPU supports none of the SIMD variants (avx2, avx512)";
}

void expect_variant_matches(const KernelTable& k, GgmlType type, const std::vector<uint8_t>& w,
                            const std::vector<uint8_t>& a, int64_t n, const char* what) {
  const float want = quant_traits(type).vec_dot(n, w.data(), a.data());
  const float got = k.dot(type)(n, w.data(), a.data());
  const double tol = float_tolerance(type, n, magnitude(type, w, a, n));
  EXPECT_LE(std::fabs(double(got) - double(want)), tol)
      << what << " " << quant_traits(type).name << " n=" << n << ": got " << got << ", reference " << want;
}

// ---------------------------------------------------------------------------------------------
// dispatch

TEST(SimdDispatch, ParsesIsaNames) {
  EXPECT_EQ(cpu::parse_isa("scalar"), CpuIsa::scalar);
  EXPECT_EQ(cpu::parse_isa("ref"), CpuIsa::scalar);
  EXPECT_EQ(cpu::parse_isa("avx2"), CpuIsa::avx2);
  EXPECT_EQ(cpu::parse_isa("avx512"), CpuIsa::avx512);
  EXPECT_EQ(cpu::parse_isa("AVX2"), std::nullopt);
  EXPECT_EQ(cpu::parse_isa(""), std::nullopt);
  for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512})
    EXPECT_EQ(cpu::parse_isa(cpu::isa_name(isa)), isa);
}

// STRATA_ISA picks the variant, capped at what the CPU supports; unset or unknown means the
// best supported one; and the start-up table is the one the environment of this process asks for.
TEST(SimdDispatch, SelectsRequestedIsaWithinSupport) {
  const CpuIsa best = cpu::best_supported_isa();
  EXPECT_TRUE(cpu::isa_supported(best));
  EXPECT_TRUE(cpu::isa_supported(CpuIsa::scalar));
  EXPECT_EQ(cpu::select_isa(nullptr), best);
  EXPECT_EQ(cpu::select_isa(""), best);
  EXPECT_EQ(cpu::select_isa("no-such-isa"), best);
  EXPECT_EQ(cpu::select_isa("scalar"), CpuIsa::scalar);
  EXPECT_EQ(cpu::select_isa("ref"), CpuIsa::scalar);
  for (CpuIsa isa : kSimdIsas) {
    const CpuIsa got = cpu::select_isa(std::string(cpu::isa_name(isa)).c_str());
    EXPECT_EQ(got, cpu::isa_supported(isa) ? isa : best) << cpu::isa_name(isa);
  }
  EXPECT_EQ(cpu::cpu_kernels().isa, cpu::select_isa(std::getenv("STRATA_ISA")));
  EXPECT_EQ(cpu::isa_name(), cpu::isa_name(cpu::cpu_kernels().isa));
}

// Each table holds its own variants (not the reference) for the SIMD types, and the reference
// for every other computable type; the scalar table is the reference.
TEST(SimdDispatch, TablesHoldTheirVariants) {
  const KernelTable& scalar = cpu::cpu_kernels(CpuIsa::scalar);
  EXPECT_EQ(scalar.isa, CpuIsa::scalar);
  for (const GgmlTypeTraits& g : kGgmlTypeTable) {
    EXPECT_EQ(scalar.dot(g.type), quant_traits(g.type).vec_dot) << g.name;
  }
  EXPECT_EQ(scalar.quantize(GgmlType::q8_k), quant_traits(GgmlType::q8_k).from_float);
  for_each_isa([&](const KernelTable& k) {
    for (const GgmlTypeTraits& g : kGgmlTypeTable) {
      const QuantTraits& t = quant_traits(g.type);
      EXPECT_EQ(k.dot(g.type) != nullptr, t.vec_dot != nullptr) << g.name;
      if (t.supported && t.vec_dot_type != GgmlType::f32) {
        EXPECT_NE(k.quantize(t.vec_dot_type), nullptr) << g.name;
      }
    }
    for (GgmlType type : kSimdTypes) EXPECT_NE(k.dot(type), quant_traits(type).vec_dot) << quant_traits(type).name;
    EXPECT_NE(k.quantize(GgmlType::q8_k), quant_traits(GgmlType::q8_k).from_float);
    EXPECT_NE(k.quantize(GgmlType::q8_0), quant_traits(GgmlType::q8_0).from_float);
    if (k.isa == CpuIsa::avx512) {
      const KernelTable& avx2 = cpu::cpu_kernels(CpuIsa::avx2);
      for (GgmlType type : kSimdTypes) EXPECT_NE(k.dot(type), avx2.dot(type)) << quant_traits(type).name;
    }
  });
}

// ---------------------------------------------------------------------------------------------
// activation quantizers: bit-identical blocks

void expect_same_bytes(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      ADD_FAILURE() << what << ": byte " << i << " differs: " << int(got[i]) << " vs reference " << int(want[i]);
      return;
    }
  }
}

// Rows for the quantizers: random activations; rows whose scale is exactly 1 and whose values
// are exact halves (ties: Q8_K rounds them to even, Q8_0 away from zero); the largest magnitude
// twice with both signs (Q8_K takes the first one's sign); tiny values (subnormal fp16 scale);
// zeros.
std::vector<std::vector<float>> quantizer_rows(Rng& rng, int64_t n, GgmlType act_type) {
  std::vector<std::vector<float>> rows;
  rows.push_back(rng.activations(n));
  std::vector<float> ties(static_cast<size_t>(n));
  const int block = int(quant_traits(act_type).block_size);
  for (size_t i = 0; i < ties.size(); ++i) {
    ties[i] = float(rng.int_in(-126, 125)) + 0.5f;
    // Q8_K: max = -127 gives iscale = 1; Q8_0: amax = 127 gives d = 1
    if (i % size_t(block) == 0) ties[i] = act_type == GgmlType::q8_k ? -127.0f : 127.0f;
  }
  rows.push_back(ties);
  std::vector<float> two_signs = rng.activations(n);
  for (size_t i = 0; i < two_signs.size(); i += size_t(block)) {
    two_signs[i + 3] = 100.0f;
    two_signs[i + size_t(block) - 2] = -100.0f;
  }
  rows.push_back(two_signs);
  std::vector<float> tiny = rng.activations(n);
  for (float& v : tiny) v *= 1e-9f;
  rows.push_back(tiny);
  std::vector<float> mixed = rng.activations(n);
  for (size_t i = 0; i < size_t(block); ++i) mixed[i] = 0.0f;  // first block all zeros
  rows.push_back(mixed);
  return rows;
}

TEST(SimdQuantize, Q8KBlocksBitIdentical) {
  SEED_TRACE();
  Rng rng(101);
  for_each_isa([&](const KernelTable& k) {
    for (int64_t n : kLengths) {
      for (const auto& x : quantizer_rows(rng, n, GgmlType::q8_k)) {
        const std::vector<uint8_t> want = quantize_reference(GgmlType::q8_k, x);
        std::vector<uint8_t> got(want.size(), 0xAB);
        k.quantize(GgmlType::q8_k)(x.data(), got.data(), n);
        expect_same_bytes(got, want, ("q8_K n=" + std::to_string(n)).c_str());
      }
    }
  });
}

TEST(SimdQuantize, Q80BlocksBitIdentical) {
  SEED_TRACE();
  Rng rng(102);
  for_each_isa([&](const KernelTable& k) {
    for (int64_t n : kLengths) {
      for (const auto& x : quantizer_rows(rng, n, GgmlType::q8_0)) {
        const std::vector<uint8_t> want = quantize_reference(GgmlType::q8_0, x);
        std::vector<uint8_t> got(want.size(), 0xAB);
        k.quantize(GgmlType::q8_0)(x.data(), got.data(), n);
        expect_same_bytes(got, want, ("q8_0 n=" + std::to_string(n)).c_str());
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// dot products

// The weight row of the exact test below: one power-of-two scale 2^d_exp (random sign; Q4_K /
// Q5_K: dmin = 2^d_exp) for every block, Q6_K sub-block scales in -31..31; F16 / BF16 values
// integers in -7..7 times 2^d_exp.
void make_exact_weights(Rng& rng, GgmlType type, std::vector<uint8_t>& w, int64_t n, int d_exp) {
  if (is_float16(type)) {
    for (size_t i = 0; i < size_t(n); ++i)
      put_half(w, 2 * i, to_float16(type, std::ldexp(float(rng.int_in(-7, 7)), d_exp)));
    return;
  }
  const QuantTraits& t = quant_traits(type);
  const ScaleFields f = scale_fields(type);
  const uint16_t d = f32_to_fp16(std::ldexp(rng.int_in(0, 1) ? 1.0f : -1.0f, d_exp));
  const uint16_t dmin = f32_to_fp16(std::ldexp(1.0f, d_exp));
  const uint8_t e = uint8_t(127 + 1 + d_exp);  // mxfp4: 2^(e - 128) = 2^d_exp
  for (size_t i = 0; i < size_t(n / t.block_size); ++i) {
    uint8_t* b = w.data() + i * t.type_size;
    if (type == GgmlType::mxfp4) {
      b[f.d] = e;
    } else {
      std::memcpy(b + f.d, &d, 2);
      if (has_mins(type)) std::memcpy(b + f.dmin, &dmin, 2);
    }
    if (type == GgmlType::q6_k) {
      auto* q = reinterpret_cast<block_q6_K*>(b);
      for (int8_t& s : q->scales) s = int8_t(rng.int_in(-31, 31));
    }
  }
}

// Exact arithmetic: one power-of-two scale d per weight row (Q4_K / Q5_K: dmin = |d|; F16 / BF16:
// small integer values times d), one per activation row, activation quants in -3..3 (Q5_K: -1..1;
// float activations likewise) and Q6_K sub-block scales in -31..31,
// so that every partial sum, in either order, is an integer multiple of the product of the scales
// below 2^24 times it (the test checks that premise: M / unit < 2^24). Then every float operation
// of both the reference and the variant is exact, and the variant must equal the reference bit for
// bit.
TEST(SimdDot, ExactWhenFloatMathIsExact) {
  SEED_TRACE();
  Rng rng(103);
  for_each_isa([&](const KernelTable& k) {
    for (GgmlType type : kSimdTypes) {
      const QuantTraits& t = quant_traits(type);
      const QuantTraits& at = quant_traits(t.vec_dot_type);
      const int qa_max = type == GgmlType::q5_k ? 1 : 3;
      for (int64_t n : lengths_for(type, {256, 1024, 4096})) {
        for (int rep = 0; rep < 4; ++rep) {
          std::vector<uint8_t> w = random_weight_row(rng, type, n);
          const int d_exp = -rng.int_in(2, 8);
          make_exact_weights(rng, type, w, n, d_exp);
          // activation blocks built directly: small quants, one power-of-two scale
          std::vector<uint8_t> a(size_t(n / at.block_size) * at.type_size);
          const int a_exp = -rng.int_in(0, 6);
          const float ad = std::ldexp(1.0f, a_exp);
          if (t.vec_dot_type == GgmlType::f32) {
            auto* x = reinterpret_cast<float*>(a.data());
            for (int64_t i = 0; i < n; ++i) x[i] = ad * float(rng.int_in(-qa_max, qa_max));
          } else if (t.vec_dot_type == GgmlType::q8_k) {
            auto* blocks = reinterpret_cast<block_q8_K*>(a.data());
            for (int64_t i = 0; i < n / QK_K; ++i) {
              blocks[i].d = ad;
              for (int j = 0; j < QK_K / 16; ++j) {
                int sum = 0;
                for (int l = 0; l < 16; ++l) sum += blocks[i].qs[16 * j + l] = int8_t(rng.int_in(-qa_max, qa_max));
                blocks[i].bsums[j] = int16_t(sum);
              }
            }
          } else {
            auto* blocks = reinterpret_cast<block_q8_0*>(a.data());
            for (int64_t i = 0; i < n / QK8_0; ++i) {
              blocks[i].d = f32_to_fp16(ad);
              for (int8_t& q : blocks[i].qs) q = int8_t(rng.int_in(-qa_max, qa_max));
            }
          }
          const double unit = std::ldexp(1.0, d_exp + a_exp);
          ASSERT_LT(magnitude(type, w, a, n) / unit, std::ldexp(1.0, 24)) << t.name << ": premise";
          const float want = t.vec_dot(n, w.data(), a.data());
          const float got = k.dot(type)(n, w.data(), a.data());
          EXPECT_EQ(f32_to_bits(got), f32_to_bits(want))
              << t.name << " n=" << n << ": got " << got << ", reference " << want;
        }
      }
    }
  });
}

TEST(SimdDot, RandomRowsWithinFloatRounding) {
  SEED_TRACE();
  Rng rng(104);
  for_each_isa([&](const KernelTable& k) {
    for (GgmlType type : kSimdTypes) {
      const GgmlType act = quant_traits(type).vec_dot_type;
      for (int64_t n : lengths_for(type, {256, 1024, 4096, 11008})) {
        for (int rep = 0; rep < 4; ++rep) {
          const std::vector<uint8_t> w = random_weight_row(rng, type, n);
          const std::vector<uint8_t> a = quantize_reference(act, rng.activations(n));
          expect_variant_matches(k, type, w, a, n, "random");
        }
      }
    }
  });
}

// The several-token dot products (KernelTable::vec_dot_tokens, a speculative verification
// step): every token's result bit-identical to vec_dot on that token alone, for 1..12 tokens, and
// through gemm_tile.
TEST(SimdDot, SeveralTokensBitIdenticalToOne) {
  SEED_TRACE();
  Rng rng(109);
  int checked = 0;
  for_each_isa([&](const KernelTable& k) {
    for (GgmlType type : {GgmlType::q4_k, GgmlType::q6_k}) {
      const cpu::VecDotTokensFn dots = k.vec_dot_tokens[size_t(type)];
      if (dots == nullptr) continue;
      SCOPED_TRACE(std::string(isa_name(k.isa)) + " " + std::string(ggml_type_name(type)));
      const GgmlType act = quant_traits(type).vec_dot_type;
      const int64_t n = 1024, rows = 3;
      std::vector<uint8_t> w;
      for (int64_t r = 0; r < rows; ++r) {
        const std::vector<uint8_t> row = random_weight_row(rng, type, n);
        w.insert(w.end(), row.begin(), row.end());
      }
      const size_t w_stride = w.size() / size_t(rows);
      for (int64_t n_tok = 1; n_tok <= cpu::kBatchInvariantTokens; ++n_tok) {
        std::vector<uint8_t> a;
        for (int64_t t = 0; t < n_tok; ++t) {
          const std::vector<uint8_t> at = quantize_reference(act, rng.activations(n));
          a.insert(a.end(), at.begin(), at.end());
        }
        const size_t a_stride = a.size() / size_t(n_tok);
        std::vector<float> got(static_cast<size_t>(n_tok)), tile(static_cast<size_t>(n_tok * rows));
        dots(n, w.data(), a.data(), a_stride, n_tok, got.data(), 1);
        k.gemm_tile(type, n, w.data(), w_stride, rows, a.data(), a_stride, n_tok, tile.data(), rows);
        for (int64_t t = 0; t < n_tok; ++t) {
          const float one = k.vec_dot[size_t(type)](n, w.data(), a.data() + size_t(t) * a_stride);
          EXPECT_EQ(got[size_t(t)], one) << n_tok << " tokens, token " << t;
          for (int64_t r = 0; r < rows; ++r)
            EXPECT_EQ(tile[size_t(t * rows + r)],
                      k.vec_dot[size_t(type)](n, w.data() + size_t(r) * w_stride, a.data() + size_t(t) * a_stride))
                << "gemm_tile, " << n_tok << " tokens, token " << t << " row " << r;
        }
        ++checked;
      }
    }
  });
  if (checked == 0) GTEST_SKIP() << "no ISA here has several-token dot products (AVX2 only; AVX-512 fuses interleaved rows)";
}

// Largest quants and sub-block scales against activations at +-127 (same sign, then alternating):
// the widest intermediate sums the kernels can meet.
TEST(SimdDot, ExtremeQuantsWithinFloatRounding) {
  SEED_TRACE();
  Rng rng(105);
  for_each_isa([&](const KernelTable& k) {
    for (GgmlType type : kSimdTypes) {
      const GgmlType act = quant_traits(type).vec_dot_type;
      for (int64_t n : lengths_for(type, {256, 4096})) {
        const std::vector<uint8_t> w = extreme_weight_row(rng, type, n);
        std::vector<float> same(static_cast<size_t>(n), -1.0f), alternating(static_cast<size_t>(n));
        for (size_t i = 0; i < alternating.size(); ++i) alternating[i] = (i % 2) ? 1.0f : -1.0f;
        for (const auto& x : {same, alternating}) {
          const std::vector<uint8_t> a = quantize_reference(act, x);
          expect_variant_matches(k, type, w, a, n, "extreme");
        }
      }
    }
  });
}

// F32 weights (routers, attention scores): the SIMD dot against the double-summed reference on
// random rows of every tail length; the bound is the float one of the other kernels with 16-lane
// partial sums: |simd - ref| <= 2 (n / 16 + 16) 2^-24 sum |w_i a_i|.
TEST(SimdDot, F32WithinFloatRounding) {
  SEED_TRACE();
  Rng rng(77);
  const VecDotFn ref = quant_traits(GgmlType::f32).vec_dot;
  for (CpuIsa isa : kSimdIsas) {
    if (!cpu::isa_supported(isa)) continue;
    const VecDotFn dot = cpu::cpu_kernels(isa).dot(GgmlType::f32);
    ASSERT_NE(dot, ref) << "no SIMD f32 kernel for " << cpu::isa_name(isa);
    for (int64_t n : {0, 1, 7, 15, 16, 33, 100, 128, 576, 4097}) {
      const std::vector<float> w = rng.activations(n), a = rng.activations(n);
      double m = 0;
      for (int64_t i = 0; i < n; ++i) m += std::abs(double(w[size_t(i)]) * a[size_t(i)]);
      const double bound = 2.0 * (double(n) / 16 + 16) * std::ldexp(1.0, -24) * m;
      EXPECT_LE(std::abs(double(dot(n, w.data(), a.data())) - double(ref(n, w.data(), a.data()))), bound)
          << cpu::isa_name(isa) << " n=" << n;
    }
  }
}

// The float matrix product (attention's Q K^T and P V) against the double-summed reference, on
// shapes with every row and column tail of the register blocks, strided operands, and both
// overwrite and accumulate: |simd - ref| <= 2 (K + 16) 2^-24 (|C0| + sum_k |a_k b_k|) per element.
TEST(SimdSgemm, MatchesReference) {
  SEED_TRACE();
  Rng rng(91);
  for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512}) {
    if (!cpu::isa_supported(isa)) continue;
    const cpu::SgemmFn sgemm = cpu::cpu_kernels(isa).sgemm;
    ASSERT_NE(sgemm, nullptr);
    for (int64_t M : {1, 3, 8, 9, 33})
      for (int64_t N : {1, 15, 16, 17, 32, 47, 130})
        for (int64_t K : {1, 64, 129})
          for (bool acc : {false, true}) {
            const int64_t lda = K + 3, ldb = N + 5, ldc = N + 2;
            const std::vector<float> A = rng.activations(M * lda), B = rng.activations(K * ldb);
            std::vector<float> C = rng.activations(M * ldc), R = C;
            const std::vector<float> C0 = C;
            sgemm(M, N, K, A.data(), lda, B.data(), ldb, C.data(), ldc, acc);
            cpu::detail::sgemm_ref(M, N, K, A.data(), lda, B.data(), ldb, R.data(), ldc, acc);
            for (int64_t m = 0; m < M; ++m)
              for (int64_t n = 0; n < ldc; ++n) {
                const size_t i = size_t(m * ldc + n);
                if (n >= N) {  // outside the product: untouched
                  ASSERT_EQ(C[i], C0[i]) << cpu::isa_name(isa) << " wrote past column " << N;
                  continue;
                }
                double mag = acc ? std::abs(double(C0[i])) : 0.0;
                for (int64_t k = 0; k < K; ++k) mag += std::abs(double(A[size_t(m * lda + k)]) * B[size_t(k * ldb + n)]);
                ASSERT_LE(std::abs(double(C[i]) - double(R[i])), 2.0 * double(K + 16) * std::ldexp(1.0, -24) * mag)
                    << cpu::isa_name(isa) << " M=" << M << " N=" << N << " K=" << K << " acc=" << acc << " at " << m << "," << n;
              }
          }
  }
}

// exp for softmax: every element within 4e-7 relative (a few float ulps) of std::exp, -inf gives
// exactly 0, the sum within float rounding of n terms; inputs over the whole useful range.
TEST(SimdExpSum, MatchesStdExp) {
  SEED_TRACE();
  Rng rng(5);
  for (CpuIsa isa : kSimdIsas) {
    if (!cpu::isa_supported(isa)) continue;
    const cpu::ExpSumFn exp_sum = cpu::cpu_kernels(isa).exp_sum;
    for (int64_t n : {1, 7, 16, 17, 100, 1000}) {
      std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
      for (float& v : x) v = rng.int_in(0, 9) == 0 ? -INFINITY : rng.uniform(-90.0f, 0.0f);
      const float max = rng.uniform(-2.0f, 2.0f);
      const float sum = exp_sum(x.data(), y.data(), n, max);
      double ref_sum = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double ref = std::exp(double(x[size_t(i)] - max));  // the difference rounded to float, as kernels take it
        ref_sum += ref;
        if (std::isinf(x[size_t(i)])) {
          ASSERT_EQ(y[size_t(i)], 0.0f) << cpu::isa_name(isa);
          continue;
        }
        // below exp(-87.3) the kernels flush to 0 (softmax terms that small do not matter)
        const double tol = 4e-7 * ref + (double(x[size_t(i)]) - max < -87.0 ? 1e-37 : 0.0);
        ASSERT_NEAR(y[size_t(i)], ref, tol) << cpu::isa_name(isa) << " x=" << x[size_t(i)] - max;
      }
      EXPECT_NEAR(sum, ref_sum, 1e-6 * ref_sum + 1e-37) << cpu::isa_name(isa) << " n=" << n;
    }
  }
}

// SwiGLU's gate: every element within 1e-6 relative of the double-precision silu(g) u, over gates
// from -100 to 100 (both tails of the exp) and every tail length.
TEST(SimdSiluMul, MatchesTheDoubleFormula) {
  SEED_TRACE();
  Rng rng(6);
  for (CpuIsa isa : kSimdIsas) {
    if (!cpu::isa_supported(isa)) continue;
    const cpu::SiluMulFn silu_mul = cpu::cpu_kernels(isa).silu_mul;
    for (int64_t n : {1, 7, 8, 15, 16, 17, 100, 768}) {
      std::vector<float> g(static_cast<size_t>(n)), u(static_cast<size_t>(n));
      for (float& v : g) v = rng.int_in(0, 9) == 0 ? rng.uniform(-100.0f, 100.0f) : rng.uniform(-8.0f, 8.0f);
      for (float& v : u) v = rng.uniform(-3.0f, 3.0f);
      std::vector<float> out = g;
      silu_mul(out.data(), u.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const double x = g[size_t(i)], ref = x / (1.0 + std::exp(-x)) * double(u[size_t(i)]);
        ASSERT_NEAR(out[size_t(i)], ref, 1e-6 * std::fabs(ref) + 1e-30)
            << cpu::isa_name(isa) << " n=" << n << " g=" << x << " u=" << u[size_t(i)];
      }
    }
  }
}

// axpy and scale: bit-identical to fma(a, x, y) and a * x at every tail length (the forward pass's
// sums must not depend on the ISA's vector width).
TEST(SimdAxpy, BitIdenticalToFmaAndProduct) {
  SEED_TRACE();
  Rng rng(8);
  for (CpuIsa isa : kSimdIsas) {
    if (!cpu::isa_supported(isa)) continue;
    const cpu::KernelTable& k = cpu::cpu_kernels(isa);
    for (int64_t n : {1, 7, 8, 15, 16, 17, 100, 2048}) {
      std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
      for (float& v : x) v = rng.uniform(-3.0f, 3.0f);
      for (float& v : y) v = rng.uniform(-3.0f, 3.0f);
      const float a = rng.uniform(-2.0f, 2.0f);
      std::vector<float> got = y, prod(static_cast<size_t>(n), -1.0f);
      k.axpy(got.data(), x.data(), a, n);
      k.scale(prod.data(), x.data(), a, n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(got[size_t(i)], std::fma(a, x[size_t(i)], y[size_t(i)])) << cpu::isa_name(isa) << " n=" << n << " i=" << i;
        ASSERT_EQ(prod[size_t(i)], a * x[size_t(i)]) << cpu::isa_name(isa) << " n=" << n << " i=" << i;
      }
    }
  }
}

// RoPE (cpu::rope): each rotated pair (neox: i and i + n_rot / 2; norm: 2i and 2i + 1) of every
// head within 1e-5 of the rotation by the same float angles (ggml's recurrence pos * base^(-2i /
// n_rot)) with double cos / sin; the dimensions past n_rot untouched.
TEST(Ops, RopeRotatesEachPairOfEveryHead) {
  SEED_TRACE();
  Rng rng(7);
  for (cpu::RopeKind kind : {cpu::RopeKind::neox, cpu::RopeKind::norm})
    for (int n_rot : {128, 64}) {  // 64: a partial rotation of 128-wide heads
      constexpr int kHeads = 5, kDim = 128;
      cpu::RopeParams p;
      p.kind = kind;
      p.n_rot = n_rot;
      p.freq_base = 1e6f;
      const int64_t pos = 3001;
      std::vector<float> x(kHeads * kDim);
      for (float& v : x) v = rng.uniform(-1.0f, 1.0f);
      std::vector<float> y = x;
      cpu::rope(y.data(), kHeads, kDim, pos, p);
      const float theta_scale = std::pow(p.freq_base, -2.0f / float(n_rot));
      for (int h = 0; h < kHeads; ++h) {
        const float* xh = x.data() + h * kDim;
        const float* yh = y.data() + h * kDim;
        float theta = float(pos);
        for (int i = 0; i < n_rot / 2; ++i, theta *= theta_scale) {
          const int a = kind == cpu::RopeKind::neox ? i : 2 * i, b = kind == cpu::RopeKind::neox ? i + n_rot / 2 : 2 * i + 1;
          const double c = std::cos(double(theta)), sn = std::sin(double(theta));
          ASSERT_NEAR(yh[a], xh[a] * c - xh[b] * sn, 1e-5) << "head " << h << " pair " << i << " n_rot " << n_rot;
          ASSERT_NEAR(yh[b], xh[a] * sn + xh[b] * c, 1e-5) << "head " << h << " pair " << i << " n_rot " << n_rot;
        }
        for (int d = n_rot; d < kDim; ++d) ASSERT_EQ(yh[d], xh[d]) << "head " << h << " dim " << d;
      }
    }
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// The f16 KV cache is widened through half_to_float: every one of the 65536 halves, at ragged
// tails, bit-identical to the scalar conversion (NaNs: NaN; the hardware quiets signalling ones).
TEST(SimdHalfToFloat, EveryHalfBitIdentical) {
  std::vector<uint16_t> all(65536 + 13);
  for (size_t i = 0; i < all.size(); ++i) all[i] = uint16_t(i * 40503u);  // every value, shuffled
  for (size_t i = 0; i < 65536; ++i) all[i] = uint16_t(i);
  for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512}) {
    if (!cpu::isa_supported(isa)) continue;
    const cpu::HalfToFloatFn fn = cpu::cpu_kernels(isa).half_to_float;
    ASSERT_NE(fn, nullptr);
    for (int64_t n : {int64_t(all.size()), int64_t(1), int64_t(7), int64_t(15), int64_t(17), int64_t(33)}) {
      std::vector<float> y(size_t(n) + 1, 12345.0f);
      fn(all.data(), y.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const float want = fp16_to_f32(all[size_t(i)]);
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(y[size_t(i)])) << cpu::isa_name(isa);
          continue;
        }
        ASSERT_EQ(f32_to_bits(y[size_t(i)]), f32_to_bits(want)) << cpu::isa_name(isa) << " half 0x" << std::hex << all[size_t(i)];
      }
      ASSERT_EQ(y[size_t(n)], 12345.0f) << cpu::isa_name(isa) << " wrote past " << n;
    }
  }
}

}  // namespace
}  // namespace strata
