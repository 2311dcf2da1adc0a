// The tile kernels (kernels.h GemmFn: src/cpu/avx2/gemm_avx2.cpp, src/cpu/avx512/gemm_avx512.cpp)
// against the scalar reference vec_dot (quant_ref.h) on fresh random data, for every ISA this CPU
// supports and every type that ISA has a tile kernel for; an ISA the CPU lacks is skipped.
//
// Tolerance. A tile kernel computes the reference's integer sums exactly and differs only in the
// order of the float scaling and accumulation (per block or super-block a few products, then a
// running sum over the nb blocks), so each output cell obeys the bound of
// tests/test_simd_kernels.cpp:
//   |gemm - ref| <= 2 (nb + 16) 2^-24 M,   M = sum_i |w_i| |a_i|
// of the dequantized weight and activation rows (Q4_K / Q5_K: the scale part and the min part of
// w_i counted separately, since the reference rounds d * isum and dmin * imins apart): the
// worst-case rounding error of two sums of nb + 16 rounded terms of total magnitude <= M. A wrong
// element, block, row or token would be off by about one term, far above that.
//
// Also checked: the kernel writes only its cells (y's padding columns when ldy > n_rows stay NaN),
// honours w_stride / a_stride larger than a row, sees every row and token in ragged shapes, and
// gives the same results when several threads run it at once on different row ranges.
//
// Randomness is fresh on every run; the seed is printed with every failure and can be replayed
// with STRATA_TEST_SEED=<seed>.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cpu/fp16.h"
#include "kernel_test_random.h"
#include "cpu/kernels.h"
#include "cpu/quant_blocks.h"
#include "cpu/quant_traits.h"
#include "cpu/repack.h"

namespace strata {
namespace {

using cpu::CpuIsa;
using cpu::GemmFn;
using cpu::KernelTable;


const CpuIsa kSimdIsas[] = {CpuIsa::avx2, CpuIsa::avx512};

void put_half(uint8_t* p, uint16_t h) { std::memcpy(p, &h, 2); }

// A random weight row at `row`: random quant bytes (every bit pattern is a valid quant), random
// valid scales. Q6_K's int8 sub-block scales are random too (-128..127).
void random_weight_row(Rng& rng, GgmlType type, int64_t n, uint8_t* row) {
  const QuantTraits& t = quant_traits(type);
  if (t.block_size == 1) {  // float types: finite values of random magnitude
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = rng.normal() * std::ldexp(1.0f, rng.int_in(-8, 4));
    t.from_float(v.data(), row, n);
    return;
  }
  const size_t nb = size_t(n / t.block_size);
  for (size_t i = 0; i < nb * t.type_size; ++i) row[i] = rng.byte();
  const ScaleFields f = scale_fields(type);
  for (size_t i = 0; i < nb; ++i) {
    uint8_t* b = row + i * t.type_size;
    if (type == GgmlType::mxfp4) {
      b[f.d] = uint8_t(rng.int_in(110, 130));
      continue;
    }
    put_half(b + f.d, rng.half_scale(f.signed_scale));
    if (f.dmin != SIZE_MAX) put_half(b + f.dmin, rng.half_scale(false));
  }
}

// Every quant at its largest magnitude (most negative where the format is signed) and the packed
// sub-block scales at their largest: the widest intermediate sums a kernel can meet. Kernels may
// also multiply stored quants offset to unsigned (Q6_K's q + 32, Q4_0's, a table's index): with
// `top` the quants take the largest value instead.
void make_extreme(GgmlType type, int64_t n, uint8_t* row, bool top) {
  const QuantTraits& t = quant_traits(type);
  for (size_t i = 0; i < size_t(n / t.block_size); ++i) {
    uint8_t* b = row + i * t.type_size;
    switch (type) {
      case GgmlType::q4_0: std::memset(reinterpret_cast<block_q4_0*>(b)->qs, top ? 0xFF : 0x00, 16); break;
      case GgmlType::q5_0: {
        auto* q = reinterpret_cast<block_q5_0*>(b);
        std::memset(q->qs, 0x00, 16);
        std::memset(q->qh, 0x00, 4);
        break;
      }
      case GgmlType::q8_0: std::memset(reinterpret_cast<block_q8_0*>(b)->qs, top ? 0x7F : 0x80, 32); break;
      case GgmlType::iq4_nl: std::memset(reinterpret_cast<block_iq4_nl*>(b)->qs, top ? 0xFF : 0x00, 16); break;
      // index 15 is -6 (doubled: -12), 7 is +6
      case GgmlType::mxfp4: std::memset(reinterpret_cast<block_mxfp4*>(b)->qs, top ? 0x77 : 0xFF, 16); break;
      case GgmlType::q4_k: {
        auto* q = reinterpret_cast<block_q4_K*>(b);
        std::memset(q->scales, 0xFF, 12);
        std::memset(q->qs, 0xFF, 128);
        break;
      }
      case GgmlType::q5_k: {
        auto* q = reinterpret_cast<block_q5_K*>(b);
        std::memset(q->scales, 0xFF, 12);
        std::memset(q->qs, 0xFF, 128);
        std::memset(q->qh, 0xFF, 32);
        break;
      }
      case GgmlType::q6_k: {
        auto* q = reinterpret_cast<block_q6_K*>(b);
        std::memset(q->ql, top ? 0xFF : 0x00, 128);
        std::memset(q->qh, top ? 0xFF : 0x00, 64);
        std::memset(q->scales, 0x80, 16);
        break;
      }
      case GgmlType::f16: put_half(b, 0xFBFF); break;   // -65504, the largest finite half
      case GgmlType::bf16: put_half(b, 0xF180); break;  // about -2^100
      case GgmlType::f32: {
        const float v = -0x1p100f;
        std::memcpy(b, &v, 4);
        break;
      }
      default: ADD_FAILURE() << "no extreme row for " << t.name;
    }
  }
}

std::vector<float> dequantize(GgmlType type, const uint8_t* row, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n));
  quant_traits(type).dequantize_row(row, y.data(), n);
  return y;
}

// |w_i| of a weight row for the magnitude M: Q4_K / Q5_K as |scale part| + |min part|.
std::vector<double> weight_magnitudes(GgmlType type, const uint8_t* row, int64_t n) {
  const QuantTraits& t = quant_traits(type);
  std::vector<double> m(static_cast<size_t>(n));
  if (has_mins(type)) {
    const ScaleFields f = scale_fields(type);
    const size_t bytes = size_t(n / t.block_size) * t.type_size;
    std::vector<uint8_t> scale_part(row, row + bytes), min_part(row, row + bytes);
    for (size_t i = 0; i < size_t(n / t.block_size); ++i) {
      put_half(&scale_part[i * t.type_size + f.dmin], 0);
      put_half(&min_part[i * t.type_size + f.d], 0);
    }
    const std::vector<float> s = dequantize(type, scale_part.data(), n), mn = dequantize(type, min_part.data(), n);
    for (size_t i = 0; i < m.size(); ++i) m[i] = std::fabs(double(s[i])) + std::fabs(double(mn[i]));
  } else {
    const std::vector<float> w = dequantize(type, row, n);
    for (size_t i = 0; i < m.size(); ++i) m[i] = std::fabs(double(w[i]));
  }
  return m;
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

// The types a table has a tile kernel for.
std::vector<GgmlType> gemm_types(const KernelTable& k) {
  std::vector<GgmlType> v;
  for (const GgmlTypeTraits& g : kGgmlTypeTable)
    if (k.gemm[size_t(g.type)] != nullptr) v.push_back(g.type);
  return v;
}

// A problem: n_rows weight rows and n_tok activation rows, each at its stride, random.
struct Problem {
  GgmlType type;
  int64_t n, n_rows, n_tok;
  size_t w_stride, a_stride;
  std::vector<uint8_t> w, a;

  Problem(Rng& rng, GgmlType type_, int64_t n_, int64_t rows, int64_t toks, size_t w_pad, size_t a_pad,
          bool extreme = false)
      : type(type_), n(n_), n_rows(rows), n_tok(toks) {
    const QuantTraits& t = quant_traits(type);
    const QuantTraits& at = quant_traits(t.vec_dot_type);
    w_stride = size_t(n / t.block_size) * t.type_size + w_pad;
    a_stride = size_t(n / at.block_size) * at.type_size + a_pad;
    w.assign(w_stride * size_t(n_rows), 0xCD);
    a.assign(a_stride * size_t(n_tok), 0xCD);
    for (int64_t r = 0; r < n_rows; ++r) {
      random_weight_row(rng, type, n, row(r));
      if (extreme) make_extreme(type, n, row(r), r % 2 == 1);
    }
    for (int64_t i = 0; i < n_tok; ++i) {
      std::vector<float> x = rng.activations(n);
      if (extreme)
        for (size_t j = 0; j < x.size(); ++j) x[j] = (i % 2 == 0 || j % 2 == 0) ? -1.0f : 1.0f;
      at.from_float(x.data(), tok(i), n);
    }
  }
  uint8_t* row(int64_t r) { return w.data() + size_t(r) * w_stride; }
  uint8_t* tok(int64_t i) { return a.data() + size_t(i) * a_stride; }
};

// Runs the kernel into a NaN-filled y of leading dimension ldy and checks every cell against the
// reference (and the padding columns r >= n_rows untouched).
// gemm (default: the table's tile kernel) reads the weights at w (default: p.w, the file layout).
void check_gemm(const KernelTable& k, Problem& p, int64_t ldy, GemmFn gemm = nullptr,
                const uint8_t* w = nullptr) {
  const QuantTraits& t = quant_traits(p.type);
  if (gemm == nullptr) gemm = k.gemm[size_t(p.type)];
  ASSERT_NE(gemm, nullptr);
  std::vector<float> y(size_t(ldy * p.n_tok), std::nanf(""));
  gemm(p.n, w ? w : p.w.data(), p.w_stride, p.n_rows, p.a.data(), p.a_stride, p.n_tok, y.data(), ldy);

  std::vector<std::vector<double>> wm;
  for (int64_t r = 0; r < p.n_rows; ++r) wm.push_back(weight_magnitudes(p.type, p.row(r), p.n));
  const double nb = double(p.n / t.block_size);
  const std::string shape = std::string(t.name) + " n=" + std::to_string(p.n) + " rows=" +
                            std::to_string(p.n_rows) + " tok=" + std::to_string(p.n_tok) + " ldy=" +
                            std::to_string(ldy);
  int failures = 0;
  for (int64_t i = 0; i < p.n_tok && failures < 5; ++i) {
    const std::vector<float> ad = dequantize(t.vec_dot_type, p.tok(i), p.n);
    for (int64_t r = 0; r < p.n_rows && failures < 5; ++r) {
      const float want = t.vec_dot(p.n, p.row(r), p.tok(i));
      const float got = y[size_t(i * ldy + r)];
      double m = 0;
      for (size_t e = 0; e < ad.size(); ++e) m += wm[size_t(r)][e] * std::fabs(double(ad[e]));
      const double tol = 2.0 * (nb + 16.0) * std::ldexp(1.0, -24) * m + 1e-30;
      if (!(std::fabs(double(got) - double(want)) <= tol)) {
        ADD_FAILURE() << shape << ": y[tok " << i << "][row " << r << "] = " << got << ", reference " << want
                      << " (tolerance " << tol << ")";
        ++failures;
      }
    }
    for (int64_t r = p.n_rows; r < ldy; ++r) {
      if (!std::isnan(y[size_t(i * ldy + r)])) {
        ADD_FAILURE() << shape << ": wrote padding cell y[tok " << i << "][" << r << "]";
        ++failures;
      }
    }
  }
}

std::vector<int64_t> lengths_for(GgmlType type) {
  // 4608 and 4640: several L1 panels of unpacked tiles (the AVX-512 kernels' panels hold about
  // 2048 elements), the last one short
  std::vector<int64_t> v = {256, 768, 2048, 4608};
  // 32-element formats take blocks eight at a time: 3, 9, 13 and 145 blocks leave remainders
  if (quant_traits(type).block_size == 32) v.insert(v.end(), {96, 288, 416, 4640});
  // float types: any length; 1, 15, 100 and 300 leave every tail of the 16-element steps and of
  // the 256-element chunks
  if (quant_traits(type).block_size == 1) v.insert(v.end(), {1, 15, 100, 300});
  return v;
}

TEST(GemmKernels, RandomTilesMatchReference) {
  SEED_TRACE();
  Rng rng(201);
  for_each_isa([&](const KernelTable& k) {
    for (GgmlType type : gemm_types(k)) {
      for (int64_t n : lengths_for(type)) {
        for (int64_t rows : {1, 7, 16, 33, 64}) {
          for (int64_t tok : {1, 2, 7, 33, 64, 130}) {  // 33: blocks of 7 and 6 tokens
            // padded strides and ldy on every other shape
            const bool pad = (rows + tok) % 2 == 1;
            Problem p(rng, type, n, rows, tok, pad ? 48 : 0, pad ? 20 : 0);
            check_gemm(k, p, pad ? rows + 5 : rows);
          }
        }
      }
    }
  });
}

TEST(GemmKernels, ExtremeQuantsMatchReference) {
  SEED_TRACE();
  Rng rng(202);
  for_each_isa([&](const KernelTable& k) {
    for (GgmlType type : gemm_types(k)) {
      Problem p(rng, type, 2048, 19, 11, 0, 0, /*extreme=*/true);
      check_gemm(k, p, 19);
    }
  });
}

// The caller runs the kernel on row chunks from several threads at once: same cells as one call.
TEST(GemmKernels, ConcurrentRowChunksMatchOneCall) {
  SEED_TRACE();
  Rng rng(203);
  for_each_isa([&](const KernelTable& k) {
    for (GgmlType type : gemm_types(k)) {
      Problem p(rng, type, 1024, 96, 37, 0, 0);
      const GemmFn gemm = k.gemm[size_t(type)];
      std::vector<float> one(size_t(p.n_rows * p.n_tok)), many(one.size(), std::nanf(""));
      gemm(p.n, p.w.data(), p.w_stride, p.n_rows, p.a.data(), p.a_stride, p.n_tok, one.data(), p.n_rows);
      std::vector<std::thread> threads;
      for (int64_t r0 = 0; r0 < p.n_rows; r0 += 16) {
        threads.emplace_back([&, r0] {
          gemm(p.n, p.row(r0), p.w_stride, 16, p.a.data(), p.a_stride, p.n_tok, many.data() + r0, p.n_rows);
        });
      }
      for (auto& th : threads) th.join();
      EXPECT_EQ(std::memcmp(one.data(), many.data(), one.size() * sizeof(float)), 0) << quant_traits(type).name;
    }
  });
}

// Row-interleaved weights (cpu/repack.h): every group deinterleaves back to its rows, and
// file_row finds rows inside groups and in the file-layout tail.
TEST(Interleave, RoundTripsEveryRow) {
  SEED_TRACE();
  Rng rng(204);
  for (const GgmlTypeTraits& g : kGgmlTypeTable) {
    if (cpu::interleave_layout(g.type).block == 0) continue;
    SCOPED_TRACE(std::string(g.name));
    Problem p(rng, g.type, 768, 37, 1, 0, 0);  // two groups and a tail of 5 rows
    std::vector<uint8_t> w = p.w;
    for (int64_t r0 = 0; r0 + 16 <= p.n_rows; r0 += 16)
      cpu::interleave_group(p.type, p.row(r0), p.w_stride, w.data() + size_t(r0) * p.w_stride);
    EXPECT_NE(std::memcmp(w.data(), p.w.data(), 32 * p.w_stride), 0);
    Weight wt;
    wt.data = w.data();
    wt.type = p.type;
    wt.n_in = p.n;
    wt.n_out = p.n_rows;
    wt.row_bytes = p.w_stride;
    wt.interleaved = true;
    std::vector<uint8_t> tmp(p.w_stride);
    for (int64_t r = 0; r < p.n_rows; ++r)
      ASSERT_EQ(std::memcmp(cpu::file_row(wt, r, 0, tmp.data()), p.row(r), p.w_stride), 0) << "row " << r;
  }
}

// The interleaved kernels against the reference vec_dot on the rows as they were in the file
// (the reference of an interleaved kernel is: deinterleave, then the format's scalar dot), same
// tolerance as the tile kernels.
TEST(GemmKernels, InterleavedMatchReference) {
  SEED_TRACE();
  Rng rng(205);
  int kernels = 0;
  for_each_isa([&](const KernelTable& k) {
    for (const GgmlTypeTraits& g : kGgmlTypeTable) {
      const GemmFn gemm = k.gemm_interleaved[size_t(g.type)];
      if (gemm == nullptr) continue;
      ++kernels;
      for (int64_t n : lengths_for(g.type))
        for (int64_t rows : {16, 48})
          for (int64_t tok : {1, 2, 3, 4, 5, 7, 8, 9, 33, 64}) {  // 33: blocks of 7 and 6 tokens
            if (ggml_row_bytes(g.type, uint64_t(n)) % cpu::interleave_layout(g.type).block != 0) continue;
            Problem p(rng, g.type, n, rows, tok, 0, tok % 2 ? 20 : 0);
            std::vector<uint8_t> w(p.w.size());
            for (int64_t r0 = 0; r0 < rows; r0 += 16)
              cpu::interleave_group(p.type, p.row(r0), p.w_stride, w.data() + size_t(r0) * p.w_stride);
            check_gemm(k, p, tok % 2 ? rows + 3 : rows, gemm, w.data());
          }
      Problem p(rng, g.type, 2048, 32, 11, 0, 0, /*extreme=*/true);
      std::vector<uint8_t> w(p.w.size());
      for (int64_t r0 = 0; r0 < 32; r0 += 16)
        cpu::interleave_group(p.type, p.row(r0), p.w_stride, w.data() + size_t(r0) * p.w_stride);
      check_gemm(k, p, 32, gemm, w.data());
    }
  });
  if (cpu::isa_supported(CpuIsa::avx512)) {
    EXPECT_GE(kernels, 6 + 9) << "AVX2 has Q8_0, Q4_0, IQ4_NL, MXFP4, Q4_K and Q5_K interleaved kernels; AVX-512 Q4_K, "
                                 "Q5_K, Q6_K, BF16, F32 and the four 32-element formats";
  } else if (cpu::isa_supported(CpuIsa::avx2)) {
    EXPECT_GE(kernels, 6) << "AVX2 has Q8_0, Q4_0, IQ4_NL, MXFP4, Q4_K and Q5_K interleaved kernels";
  }
}

// Interleaved weights take gemm_interleaved at every token count, decode included: up to
// kBatchInvariantTokens tokens (a speculative verification step) each token's result must be
// bit-identical to its one-token result. Lengths with a short last panel (64 blocks of 32) and a
// short last unit (91 blocks: units of 2; 90: MXFP4's of 4).
TEST(GemmKernels, InterleavedTokensBitIdenticalToOne) {
  SEED_TRACE();
  Rng rng(206);
  for_each_isa([&](const KernelTable& k) {
    for (const GgmlTypeTraits& g : kGgmlTypeTable) {
      const GemmFn gemm = k.gemm_interleaved[size_t(g.type)];
      if (gemm == nullptr) continue;
      for (int64_t n : {int64_t(2880), int64_t(2912), int64_t(4608)}) {
        if (n % int64_t(quant_traits(g.type).block_size) != 0) continue;
        SCOPED_TRACE(std::string(isa_name(k.isa)) + " " + std::string(g.name) + " n=" + std::to_string(n));
        const int64_t rows = 32, n_tok = cpu::kBatchInvariantTokens;
        Problem p(rng, g.type, n, rows, n_tok, 0, 0);
        std::vector<uint8_t> w(p.w.size());
        for (int64_t r0 = 0; r0 < rows; r0 += 16)
          cpu::interleave_group(p.type, p.row(r0), p.w_stride, w.data() + size_t(r0) * p.w_stride);
        std::vector<float> one(size_t(rows * n_tok));
        for (int64_t t = 0; t < n_tok; ++t) gemm(p.n, w.data(), p.w_stride, rows, p.tok(t), p.a_stride, 1, one.data() + t * rows, rows);
        for (int64_t m = 2; m <= n_tok; ++m) {
          std::vector<float> many(size_t(rows * m));
          gemm(p.n, w.data(), p.w_stride, rows, p.a.data(), p.a_stride, m, many.data(), rows);
          for (int64_t i = 0; i < rows * m; ++i)
            ASSERT_EQ(many[size_t(i)], one[size_t(i)]) << m << " tokens: token " << i / rows << " row " << i % rows;
        }
      }
    }
  });
}

}  // namespace
}  // namespace strata
