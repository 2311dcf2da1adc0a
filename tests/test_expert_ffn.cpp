// The fused expert FFN (moe_ffn, swiglu_ffn in model/blocks.h) against a plain reference: every
// token's chosen experts computed one by one in double from the dequantized weights. Random
// weights (Q8_0 and Q4_K gate/up, Q6_K down), random activations and routings, including skewed
// ones (one expert taken by every token, as real routers do), biases and gpt-oss's clamped GLU.
//
// Tolerances (relative to the RMS of the reference output):
//  - exact path (weights dequantized, float activations): 1e-5, float rounding of sums of a few
//    thousand terms;
//  - quantized path (activations rounded to Q8_0 / Q8_K before the integer dot products), against
//    a reference that rounds them the same way: 1e-4 after the roundings the reference cannot
//    decide. A GLU output within 0.1% of an 8-bit step of a rounding boundary may round either
//    way in float (the engine) and double (the reference); one such flip moves a token's output
//    by a step (1/127 of its block's largest value) times its down column, up to 2e-3 of the
//    output's RMS. The reference lists those outputs with the move each would make; a move is
//    taken only where it brings that token's row closer to the engine, and what is left over must
//    be float rounding (measured 2e-7 typical, 3e-5 worst over 80 seeds). Without the rounding in
//    the reference the difference is the 8-bit rounding itself, 1-4e-2 on these random weights.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "cpu/fp16.h"
#include "cpu/ops.h"
#include "cpu/quant_blocks.h"
#include "cpu/quant_traits.h"
#include "cpu/thread_pool.h"
#include "model/blocks.h"

namespace strata {
namespace {

struct Stack {
  std::vector<uint8_t> bytes;
  Weight w;
};

// n_mat random matrices [n_out][n_in] of `type`.
Stack random_stack(std::mt19937_64& rng, GgmlType type, int64_t n_in, int64_t n_out, int64_t n_mat) {
  const QuantTraits& q = quant_traits(type);
  Stack s;
  s.w.type = type;
  s.w.n_in = n_in;
  s.w.n_out = n_out;
  s.w.n_mat = n_mat;
  s.w.row_bytes = size_t(n_in) / q.block_size * q.type_size;
  s.bytes.resize(s.w.row_bytes * size_t(n_out * n_mat));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  if (q.from_float) {
    std::vector<float> row(static_cast<size_t>(n_in));
    for (int64_t r = 0; r < n_out * n_mat; ++r) {
      for (float& v : row) v = nd(rng) * 0.05f;
      q.from_float(row.data(), s.bytes.data() + size_t(r) * s.w.row_bytes, n_in);
    }
  } else {  // random quants, valid small scales
    for (uint8_t& b : s.bytes) b = uint8_t(rng());
    for (size_t b = 0; b < s.bytes.size() / q.type_size; ++b) {
      uint8_t* blk = s.bytes.data() + b * q.type_size;
      const uint16_t h = f32_to_fp16(std::ldexp(1.0f + float(rng() % 64) / 64.0f, -9));
      if (type == GgmlType::q6_k) {
        std::memcpy(blk + offsetof(block_q6_K, d), &h, 2);
      } else {  // q4_K: d and dmin
        std::memcpy(blk, &h, 2);
        std::memcpy(blk + 2, &h, 2);
      }
    }
  }
  s.w.data = s.bytes.data();
  return s;
}

std::vector<float> dequant(const Weight& w, int64_t mat, int64_t row) {
  std::vector<float> out(static_cast<size_t>(w.n_in));
  quant_traits(w.type).dequantize_row(w.row(row, mat), out.data(), w.n_in);
  return out;
}

double glu_ref(const GluParams& p, double g, double u) {
  if (p.kind == GluKind::silu) return g / (1.0 + std::exp(-g)) * u;
  const double x = std::min(g, double(p.limit)), y = std::clamp(u, -double(p.limit), double(p.limit));
  return x / (1.0 + std::exp(-double(p.alpha) * x)) * (y + 1.0);
}

struct Case {
  GgmlType gate_up, down;
  int64_t n_tok;
  bool skewed, biases;
  GluKind glu;
};

void check(const Case& c, uint64_t seed) {
  SCOPED_TRACE("seed " + std::to_string(seed) + " n_tok " + std::to_string(c.n_tok));
  std::mt19937_64 rng(seed);
  const int64_t E = 256, F = 512, n_exp = 16;
  const int k = 4;
  Stack gate = random_stack(rng, c.gate_up, E, F, n_exp), up = random_stack(rng, c.gate_up, E, F, n_exp),
        down = random_stack(rng, c.down, F, E, n_exp);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> gb(size_t(n_exp * F)), ub(size_t(n_exp * F)), db(size_t(n_exp * E));
  for (auto* v : {&gb, &ub, &db})
    for (float& x : *v) x = nd(rng) * 0.1f;
  Stack gbs{{}, {}}, ubs{{}, {}}, dbs{{}, {}};
  LayerWeights l;
  l.gate_exps = gate.w;
  l.up_exps = up.w;
  l.down_exps = down.w;
  if (c.biases) {
    l.gate_exps_b = Weight::f32(gb.data(), F, n_exp);
    l.up_exps_b = Weight::f32(ub.data(), F, n_exp);
    l.down_exps_b = Weight::f32(db.data(), E, n_exp);
  }
  const GluParams glu = c.glu == GluKind::silu ? GluParams{} : GluParams{GluKind::swiglu_oai, 1.702f, 7.0f};

  std::vector<float> h(size_t(c.n_tok * E));
  for (float& x : h) x = nd(rng);
  Routing r;
  r.k = k;
  for (int64_t t = 0; t < c.n_tok; ++t) {
    std::vector<int> ids(n_exp);
    for (int i = 0; i < n_exp; ++i) ids[size_t(i)] = i;
    std::shuffle(ids.begin(), ids.end(), rng);
    if (c.skewed) {  // expert 3 in every token, first
      auto it = std::find(ids.begin(), ids.end(), 3);
      std::iter_swap(ids.begin(), it);
    }
    for (int j = 0; j < k; ++j) {
      r.ids.push_back(ids[size_t(j)]);
      r.weights.push_back(std::uniform_real_distribution<float>(0.1f, 1.0f)(rng));
    }
  }

  // The reference, in double from the dequantized weights. For the quantized path it rounds the
  // activations as the engine does (h to gate/up's vec_dot type, the GLU output to down's), and
  // lists the GLU outputs near a rounding boundary as flips.
  struct Flip {  // output row t may move by `delta` (E values) if the engine rounded the other way
    int64_t t;
    std::vector<double> delta;
  };
  struct Reference {
    std::vector<double> out;
    std::vector<Flip> flips;
  };
  auto reference = [&](bool round_acts) {
    auto rounded = [&](std::vector<float> x, GgmlType weight_type) {
      const GgmlType at = quant_traits(weight_type).vec_dot_type;
      if (!round_acts || at == GgmlType::f32) return x;
      std::vector<uint8_t> q(ggml_row_bytes(at, uint64_t(x.size())));
      quant_traits(at).from_float(x.data(), q.data(), int64_t(x.size()));
      quant_traits(at).dequantize_row(q.data(), x.data(), int64_t(x.size()));
      return x;
    };
    // (the other rounding - this one) of each element of x that a nudge of 0.1% of its block's
    // step rounds differently, else 0.
    auto undecided = [&](const std::vector<float>& x, const std::vector<float>& xq, GgmlType weight_type) {
      std::vector<double> d(x.size(), 0.0);
      const GgmlType at = quant_traits(weight_type).vec_dot_type;
      if (!round_acts || at == GgmlType::f32) return d;
      const int64_t bs = quant_traits(at).block_size;
      for (size_t b0 = 0; b0 < x.size(); b0 += size_t(bs)) {
        float amax = 0;
        for (int64_t i = 0; i < bs; ++i) amax = std::max(amax, std::abs(x[b0 + size_t(i)]));
        const float step = amax / 127.0f;
        for (int64_t i = 0; i < bs; ++i) {
          for (float sign : {-1.0f, 1.0f}) {
            std::vector<float> nudged(x.begin() + long(b0), x.begin() + long(b0) + bs);
            nudged[size_t(i)] += sign * 1e-3f * step;
            nudged = rounded(nudged, weight_type);
            if (nudged[size_t(i)] != xq[b0 + size_t(i)]) d[b0 + size_t(i)] = double(nudged[size_t(i)]) - xq[b0 + size_t(i)];
          }
        }
      }
      return d;
    };
    Reference ref{std::vector<double>(size_t(c.n_tok * E), 0.0), {}};
    for (int64_t t = 0; t < c.n_tok; ++t) {
      const std::vector<float> ht = rounded(std::vector<float>(h.begin() + t * E, h.begin() + (t + 1) * E), c.gate_up);
      for (int j = 0; j < k; ++j) {
        const int e = r.ids[size_t(t * k + j)];
        const double w = r.weights[size_t(t * k + j)];
        std::vector<float> glu_out(static_cast<size_t>(F));
        for (int64_t f = 0; f < F; ++f) {
          const std::vector<float> wg = dequant(gate.w, e, f), wu = dequant(up.w, e, f);
          double g = c.biases ? gb[size_t(e * F + f)] : 0.0, u = c.biases ? ub[size_t(e * F + f)] : 0.0;
          for (int64_t i = 0; i < E; ++i) {
            g += double(wg[size_t(i)]) * ht[size_t(i)];
            u += double(wu[size_t(i)]) * ht[size_t(i)];
          }
          glu_out[size_t(f)] = float(glu_ref(glu, g, u));
        }
        const std::vector<float> act = rounded(glu_out, c.down);
        const std::vector<double> other = undecided(glu_out, act, c.down);
        const size_t first_flip = ref.flips.size();
        for (int64_t f = 0; f < F; ++f)
          if (other[size_t(f)] != 0) ref.flips.push_back({t, std::vector<double>(size_t(E))});
        for (int64_t o = 0; o < E; ++o) {
          const std::vector<float> wd = dequant(down.w, e, o);
          double y = c.biases ? db[size_t(e * E + o)] : 0.0;
          for (int64_t f = 0, n = 0; f < F; ++f) {
            y += double(wd[size_t(f)]) * act[size_t(f)];
            if (other[size_t(f)] != 0) ref.flips[first_flip + size_t(n++)].delta[size_t(o)] = double(wd[size_t(f)]) * other[size_t(f)] * w;
          }
          ref.out[size_t(t * E + o)] += y * w;
        }
      }
    }
    return ref;
  };

  for (cpu::MatmulPath path : {cpu::MatmulPath::exact, cpu::MatmulPath::quantized}) {
    Reference ref = reference(path == cpu::MatmulPath::quantized);
    double rms = 0;
    for (double v : ref.out) rms += v * v;
    rms = std::sqrt(rms / double(ref.out.size()));
    ASSERT_GT(rms, 0.0);
    const cpu::Matmul be(path);
    std::vector<float> out(size_t(c.n_tok * E), std::nanf(""));
    moe_ffn(be, l, r, h.data(), c.n_tok, E, out.data(), glu);
    for (size_t i = 0; i < out.size(); ++i) ASSERT_TRUE(std::isfinite(out[i])) << "element " << i;
    // Take each undecided rounding the other way where that brings the reference nearer.
    int taken = 0;
    for (const Flip& fl : ref.flips) {
      double before = 0, after = 0;
      for (int64_t o = 0; o < E; ++o) {
        const size_t i = size_t(fl.t * E + o);
        const double d = double(out[i]) - ref.out[i];
        before += d * d;
        after += (d - fl.delta[size_t(o)]) * (d - fl.delta[size_t(o)]);
      }
      if (after >= before) continue;
      ++taken;
      for (int64_t o = 0; o < E; ++o) ref.out[size_t(fl.t * E + o)] += fl.delta[size_t(o)];
    }
    double err = 0, worst = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      const double d = double(out[i]) - ref.out[i];
      err += d * d;
      worst = std::max(worst, std::abs(d));
    }
    const double rel = std::sqrt(err / double(out.size())) / rms;
    const double tol = path == cpu::MatmulPath::exact ? 1e-5 : 1e-4;
    EXPECT_LT(rel, tol) << (path == cpu::MatmulPath::exact ? "exact" : "quantized") << " path, max |diff| "
                        << worst << ", rms " << rms << ", " << taken << " of " << ref.flips.size()
                        << " undecided roundings taken the other way";
  }
}

uint64_t fresh_seed() {
  if (const char* env = std::getenv("STRATA_TEST_SEED")) return std::strtoull(env, nullptr, 10);
  return std::random_device{}();
}

TEST(ExpertFfn, MatchesThePerExpertReference) {
  const uint64_t seed = fresh_seed();
  const Case cases[] = {
      {GgmlType::q8_0, GgmlType::q8_0, 1, false, false, GluKind::silu},
      {GgmlType::q4_k, GgmlType::q6_k, 1, false, false, GluKind::silu},
      {GgmlType::q4_k, GgmlType::q6_k, 7, true, false, GluKind::silu},
      {GgmlType::q8_0, GgmlType::q8_0, 37, true, true, GluKind::swiglu_oai},
      {GgmlType::q4_k, GgmlType::q6_k, 64, false, true, GluKind::silu},
      // one expert with every token: several token blocks, each cut into several gate/up tiles
      // (the last of them quantizes the block for down) and down tiles waiting on it
      {GgmlType::q4_k, GgmlType::q6_k, 300, true, false, GluKind::silu},
  };
  for (size_t i = 0; i < std::size(cases); ++i) check(cases[i], seed + i);
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// for_row_chunks: a prefill's rows each exactly once, in chunks on the pool; a decode step's in
// one call on the caller. rms_norm_rows, which uses it, gives each row what cpu::rms_norm gives.
TEST(RowChunks, EveryRowOnceAndSmallOnesOnTheCaller) {
  const int64_t n_rows = 1000, width = 64;  // 64000 floats: pooled
  std::vector<std::atomic<int>> seen(static_cast<size_t>(n_rows));
  std::atomic<int> calls{0};
  for_row_chunks(n_rows, width, [&](int64_t r0, int64_t r1) {
    ASSERT_LE(0, r0);
    ASSERT_LE(r0, r1);
    ASSERT_LE(r1, n_rows);
    calls.fetch_add(1);
    for (int64_t r = r0; r < r1; ++r) seen[size_t(r)].fetch_add(1);
  });
  for (int64_t r = 0; r < n_rows; ++r) ASSERT_EQ(seen[size_t(r)].load(), 1) << "row " << r;
  if (cpu::compute_pool().size() > 1) {
    EXPECT_GT(calls.load(), 1);
  }

  int small_calls = 0;
  const auto caller = std::this_thread::get_id();
  for_row_chunks(4, width, [&](int64_t r0, int64_t r1) {
    ++small_calls;
    EXPECT_EQ(r0, 0);
    EXPECT_EQ(r1, 4);
    EXPECT_EQ(std::this_thread::get_id(), caller);
  });
  EXPECT_EQ(small_calls, 1);

  const int64_t n_tok = 600, n = 128;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n_tok * n)), w(static_cast<size_t>(n)), got(x.size()), want(x.size());
  for (float& v : x) v = nd(rng);
  for (float& v : w) v = 1.0f + 0.1f * nd(rng);
  Weight wt;
  wt.data = reinterpret_cast<uint8_t*>(w.data());
  wt.type = GgmlType::f32;
  wt.n_in = n;
  wt.n_out = 1;
  wt.row_bytes = size_t(n) * sizeof(float);
  rms_norm_rows(x.data(), wt, n_tok, n, 1e-6f, got.data());
  for (int64_t t = 0; t < n_tok; ++t) cpu::rms_norm(x.data() + t * n, w.data(), n, 1e-6f, want.data() + t * n);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// Decode's task sizes (Matmul::guided_rows): every row once, in multiples of 16 but the last, long
// first, none shorter than the minimum but the last.
TEST(MatmulTasks, GuidedRowsCoverEveryRowLongestFirst) {
  for (int64_t total : {1, 15, 16, 17, 100, 768 * 8, 5120, 151936})
    for (int threads : {1, 2, 3, 16})
      for (int64_t min_rows : {0, 40, 1000}) {
        const std::vector<int64_t> rows = cpu::Matmul::guided_rows(total, threads, min_rows);
        int64_t sum = 0;
        for (size_t i = 0; i < rows.size(); ++i) {
          sum += rows[i];
          if (i + 1 == rows.size()) continue;
          EXPECT_EQ(rows[i] % 16, 0) << total << " " << threads << " " << min_rows;
          EXPECT_GE(rows[i], std::max<int64_t>(16, min_rows)) << total << " " << threads;
          EXPECT_GE(rows[i], rows[i + 1]) << total << " " << threads;
        }
        EXPECT_EQ(sum, total) << threads << " " << min_rows;
        if (total >= 4 * 16 * threads && min_rows == 0) {
          EXPECT_GE(int64_t(rows.size()), 2 * threads) << total;
        }
      }
}

// guided_ranges over parts (matrices, experts): every row of every part once, in order, each task
// within one part and starting on a 16-row boundary of it.
TEST(MatmulTasks, GuidedRangesCoverEveryPartOnce) {
  const std::vector<std::vector<int64_t>> cases = {{40, 1000, 17, 333}, {768, 768, 768}, {0, 16, 0, 5}, {1}, {}};
  for (const std::vector<int64_t>& parts : cases)
    for (int threads : {1, 2, 5}) {
      std::vector<int64_t> next(parts.size(), 0);  // each part's next uncovered row
      int64_t last_part = 0;
      for (const cpu::Matmul::RowRange& r : cpu::Matmul::guided_ranges(parts, threads, 32)) {
        ASSERT_LT(size_t(r.part), parts.size());
        EXPECT_GE(r.part, last_part);
        EXPECT_EQ(r.r0, next[size_t(r.part)]) << "part " << r.part;
        EXPECT_EQ(r.r0 % 16, 0);
        EXPECT_LT(r.r0, r.r1);
        EXPECT_LE(r.r1, parts[size_t(r.part)]);
        next[size_t(r.part)] = r.r1;
        last_part = r.part;
      }
      for (size_t i = 0; i < parts.size(); ++i) EXPECT_EQ(next[i], parts[i]) << "part " << i << " threads " << threads;
    }
}

// A batch of matrices whose row counts are not multiples of 16 (the guided tasks cut at each
// matrix's end and go on in the next): the rows of each equal its own matmul's, which equal a
// double reference.
TEST(MatmulTasks, BatchOfOddSizedMatricesMatchesOneByOne) {
  std::mt19937_64 rng(fresh_seed());
  const int64_t n_in = 256;
  const int64_t sizes[] = {40, 1000, 17, 333};
  std::vector<Stack> mats;
  for (int64_t n_out : sizes) mats.push_back(random_stack(rng, GgmlType::q8_0, n_in, n_out, 1));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n_in));
  for (float& v : x) v = nd(rng);
  const cpu::Matmul mm;
  std::vector<std::vector<float>> got, want;
  std::vector<cpu::Matmul::MatmulOut> outs;
  for (const Stack& s : mats) {
    got.emplace_back(size_t(s.w.n_out), NAN);
    want.emplace_back(size_t(s.w.n_out), NAN);
  }
  for (size_t i = 0; i < mats.size(); ++i) outs.push_back({&mats[i].w, got[i].data()});
  mm.matmul_batch(outs, x.data(), 1);
  for (size_t i = 0; i < mats.size(); ++i) {
    mm.matmul(mats[i].w, x.data(), 1, want[i].data());
    EXPECT_EQ(std::memcmp(got[i].data(), want[i].data(), want[i].size() * sizeof(float)), 0) << "matrix " << i;
    const QuantTraits& q = quant_traits(GgmlType::q8_0);
    std::vector<float> row(static_cast<size_t>(n_in));
    for (int64_t r = 0; r < mats[i].w.n_out; ++r) {
      q.dequantize_row(mats[i].w.row(r), row.data(), n_in);
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < n_in; ++k) {
        ref += double(row[size_t(k)]) * x[size_t(k)];
        mag += std::fabs(double(row[size_t(k)]) * x[size_t(k)]);
      }
      // the activations rounded to Q8_0: about 1/254 of each product
      ASSERT_NEAR(got[i][size_t(r)], ref, 1e-2 * mag + 1e-6) << "matrix " << i << " row " << r;
    }
  }
}

}  // namespace
}  // namespace strata
