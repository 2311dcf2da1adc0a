// The fused expert FFN (moe_ffn, swiglu_ffn in model/blocks.h) against a plain reference: every
// token's chosen experts computed one by one in double from the dequantized weights. Random
// weights (Q8_0 and Q4_K gate/up, Q6_K down), random activations and routings, including skewed
// ones (one expert taken by every token, as real routers do), biases and gpt-oss's clamped GLU.
//
// Tolerances (relative to the RMS of the reference output):
//  - exact path (weights dequantized, float activations): 1e-5, float rounding of sums of a few
//    thousand terms;
//  - quantized path (activations rounded to Q8_0 / Q8_K before the integer dot products), against
//    a reference that rounds them the same way: 1e-3. What is left is float rounding and the few
//    GLU outputs whose float and double values round to neighbouring 8-bit steps (one step, 1/127
//    of a block's largest value, in a handful of the 512 elements). Without the rounding in the
//    reference the difference is the 8-bit rounding itself, 1-4e-2 on these random weights.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/fp16.h"
#include "cpu/ops.h"
#include "cpu/quant_blocks.h"
#include "cpu/quant_traits.h"
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
  // activations as the engine does (h to gate/up's vec_dot type, the GLU output to down's), so
  // what remains is float rounding and the odd GLU output that lands on the other side of a
  // rounding boundary.
  auto reference = [&](bool round_acts) {
    auto rounded = [&](std::vector<float> x, GgmlType weight_type) {
      const GgmlType at = quant_traits(weight_type).vec_dot_type;
      if (!round_acts || at == GgmlType::f32) return x;
      std::vector<uint8_t> q(ggml_row_bytes(at, uint64_t(x.size())));
      quant_traits(at).from_float(x.data(), q.data(), int64_t(x.size()));
      quant_traits(at).dequantize_row(q.data(), x.data(), int64_t(x.size()));
      return x;
    };
    std::vector<double> ref(size_t(c.n_tok * E), 0.0);
    for (int64_t t = 0; t < c.n_tok; ++t) {
      const std::vector<float> ht = rounded(std::vector<float>(h.begin() + t * E, h.begin() + (t + 1) * E), c.gate_up);
      for (int j = 0; j < k; ++j) {
        const int e = r.ids[size_t(t * k + j)];
        std::vector<float> act(static_cast<size_t>(F));
        for (int64_t f = 0; f < F; ++f) {
          const std::vector<float> wg = dequant(gate.w, e, f), wu = dequant(up.w, e, f);
          double g = c.biases ? gb[size_t(e * F + f)] : 0.0, u = c.biases ? ub[size_t(e * F + f)] : 0.0;
          for (int64_t i = 0; i < E; ++i) {
            g += double(wg[size_t(i)]) * ht[size_t(i)];
            u += double(wu[size_t(i)]) * ht[size_t(i)];
          }
          act[size_t(f)] = float(glu_ref(glu, g, u));
        }
        act = rounded(act, c.down);
        for (int64_t o = 0; o < E; ++o) {
          const std::vector<float> wd = dequant(down.w, e, o);
          double y = c.biases ? db[size_t(e * E + o)] : 0.0;
          for (int64_t f = 0; f < F; ++f) y += double(wd[size_t(f)]) * act[size_t(f)];
          ref[size_t(t * E + o)] += y * r.weights[size_t(t * k + j)];
        }
      }
    }
    return ref;
  };

  for (cpu::MatmulPath path : {cpu::MatmulPath::exact, cpu::MatmulPath::quantized}) {
    const std::vector<double> ref = reference(path == cpu::MatmulPath::quantized);
    double rms = 0;
    for (double v : ref) rms += v * v;
    rms = std::sqrt(rms / double(ref.size()));
    ASSERT_GT(rms, 0.0);
    const cpu::Matmul be(path);
    std::vector<float> out(size_t(c.n_tok * E), std::nanf(""));
    moe_ffn(be, l, r, h.data(), c.n_tok, E, out.data(), glu);
    double err = 0, worst = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      const double d = double(out[i]) - ref[i];
      ASSERT_TRUE(std::isfinite(out[i])) << "element " << i;
      err += d * d;
      worst = std::max(worst, std::abs(d));
    }
    const double rel = std::sqrt(err / double(out.size())) / rms;
    const double tol = path == cpu::MatmulPath::exact ? 1e-5 : 1e-3;
    EXPECT_LT(rel, tol) << (path == cpu::MatmulPath::exact ? "exact" : "quantized") << " path, max |diff| "
                        << worst << ", rms " << rms;
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
