// The decode attention kernels (cpu/kernels.h AttendFn) of every supported ISA and KV entry
// format against a double-precision softmax over the same entries widened (cpu/kv_format.h; q8_0
// keys meet the query in q8_0, kv_query), on fresh random data: several row counts, head dims,
// ranges that start and end inside a key block, and ranges merged by their (max, sum) as the
// model's decode attention does. Tolerance: 2e-5
// relative to the output's largest magnitude (float sums over up to 300 keys; the reference's
// exponentials are exact, the kernels' a few ulps off). The AVX2 and AVX-512 q8_0 kernels multiply
// the values in integers: each key block's softmax weights times the value scales rounded to int16,
// 2^-16 of the block's largest, i.e. an error up to 2^-16 |v| per key term; over 300 keys with
// the weights spread out that measured up to 1.5e-4 of the output's largest magnitude (150 seeds):
// 4e-4 there (the q8_0 values' own rounding is about 1e-2 of it).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/kv_format.h"
#include "kernel_test_random.h"
#include "model/blocks.h"
#include "model/kv_cache.h"

namespace strata {
namespace {

using cpu::KvType;

struct Case {
  int rows;
  int64_t dk, dv, n, first;
};

// Keys and values of n positions in the cache layout of type t (blocks of 32 keys, value rows).
struct Entries {
  std::vector<uint8_t> k, v;
  size_t k_stride, v_stride;
  Entries(KvType t, int64_t dk, int64_t dv, int64_t n, Rng& rng)
      : k_stride(cpu::kv_key_block_bytes(t, dk)), v_stride(cpu::kv_value_row_bytes(t, dv)) {
    const int64_t blocks = (n + cpu::kKvKeyBlock - 1) / cpu::kKvKeyBlock;
    k.assign(size_t(blocks) * k_stride, 0xFF);  // unwritten slots of the last block: garbage (NaN halves)
    v.assign(size_t(blocks * cpu::kKvKeyBlock) * v_stride, 0xFF);
    std::vector<float> x(size_t(std::max(dk, dv)));
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t d = 0; d < dk; ++d) x[size_t(d)] = rng.normal();
      cpu::kv_store_key(t, x.data(), dk, k.data() + size_t(j / cpu::kKvKeyBlock) * k_stride, j % cpu::kKvKeyBlock);
      for (int64_t d = 0; d < dv; ++d) x[size_t(d)] = rng.normal();
      cpu::kv_store_value(t, x.data(), dv, v.data() + size_t(j) * v_stride);
    }
  }
};

// o[rows][dv]: softmax(q K^T) V over keys [first, n), in double, from the widened entries
std::vector<double> reference(KvType t, const Entries& e, const std::vector<float>& q, const Case& c) {
  const int64_t kb = cpu::kKvKeyBlock;
  std::vector<float> kf(size_t(c.dk * kb)), vf(size_t(c.dv));
  std::vector<double> s(size_t(c.rows * c.n)), o(size_t(c.rows * c.dv), 0.0);
  std::vector<float> qk(q.size());
  cpu::kv_query(t, q.data(), c.rows, c.dk, qk.data());  // q8_0 keys: q in q8_0
  for (int64_t j = c.first; j < c.n; ++j) {
    cpu::kv_widen_keys(t, e.k.data() + size_t(j / kb) * e.k_stride, c.dk, kf.data());
    for (int r = 0; r < c.rows; ++r) {
      double acc = 0;
      for (int64_t d = 0; d < c.dk; ++d) acc += double(qk[size_t(r * c.dk + d)]) * kf[size_t(d * kb + j % kb)];
      s[size_t(r * c.n + j)] = acc;
    }
  }
  for (int r = 0; r < c.rows; ++r) {
    double mx = -INFINITY, sum = 0;
    for (int64_t j = c.first; j < c.n; ++j) mx = std::max(mx, s[size_t(r * c.n + j)]);
    for (int64_t j = c.first; j < c.n; ++j) sum += std::exp(s[size_t(r * c.n + j)] - mx);
    for (int64_t j = c.first; j < c.n; ++j) {
      cpu::kv_widen_values(t, e.v.data() + size_t(j) * e.v_stride, e.v_stride, 1, c.dv, vf.data());
      const double w = std::exp(s[size_t(r * c.n + j)] - mx) / sum;
      for (int64_t i = 0; i < c.dv; ++i) o[size_t(r * c.dv + i)] += w * vf[size_t(i)];
    }
  }
  return o;
}

// The kernel over [first, n) in ranges of `split` keys (a multiple of 32: whole key blocks),
// merged by (m, l); normalised output [rows][dv].
std::vector<float> run(cpu::AttendFn attend, const Entries& e, const std::vector<float>& q, const Case& c,
                       int64_t split) {
  std::vector<float> out(size_t(c.rows * c.dv), 0.0f), mx(size_t(c.rows), -INFINITY), sum(size_t(c.rows), 0.0f);
  std::vector<std::vector<float>> ms, ls, os;
  for (int64_t j0 = 0; j0 < c.n; j0 += split) {
    std::vector<float> m(size_t(c.rows), -INFINITY), l(size_t(c.rows), 0.0f), o(size_t(c.rows * c.dv), 0.0f);
    cpu::AttendArgs a;
    a.rows = c.rows;
    a.dk = c.dk;
    a.dv = c.dv;
    a.q = q.data();
    a.k = e.k.data() + size_t(j0 / cpu::kKvKeyBlock) * e.k_stride;
    a.k_block_stride = e.k_stride;
    a.v = e.v.data() + size_t(j0) * e.v_stride;
    a.v_row_stride = e.v_stride;
    a.first = std::max<int64_t>(c.first - j0, 0);
    a.n = std::min(c.n, j0 + split) - j0;
    a.m = m.data();
    a.l = l.data();
    a.o = o.data();
    attend(a);
    for (int r = 0; r < c.rows; ++r) mx[size_t(r)] = std::max(mx[size_t(r)], m[size_t(r)]);
    ms.push_back(m);
    ls.push_back(l);
    os.push_back(o);
  }
  for (size_t p = 0; p < ms.size(); ++p)
    for (int r = 0; r < c.rows; ++r) {
      if (ms[p][size_t(r)] == -INFINITY) continue;
      const float w = std::exp(ms[p][size_t(r)] - mx[size_t(r)]);
      sum[size_t(r)] += w * ls[p][size_t(r)];
      for (int64_t i = 0; i < c.dv; ++i) out[size_t(r * c.dv + i)] += w * os[p][size_t(r * c.dv + i)];
    }
  for (int r = 0; r < c.rows; ++r)
    for (int64_t i = 0; i < c.dv; ++i) out[size_t(r * c.dv + i)] /= sum[size_t(r)];
  return out;
}

TEST(AttendKernels, MatchDoubleSoftmaxOnEveryFormatAndIsa) {
  SEED_TRACE();
  Rng rng(41);
  const Case cases[] = {{8, 128, 128, 300, 0}, {1, 64, 64, 1, 0},    {4, 128, 64, 33, 0},  {16, 64, 128, 96, 0},
                        {3, 96, 96, 250, 70},  {8, 128, 128, 64, 31}, {6, 32, 32, 129, 128}, {12, 64, 64, 200, 0},
                        {4, 256, 256, 70, 5},  {16, 512, 64, 40, 0}};  // the widest q8_0 query buffer
  for (cpu::CpuIsa isa : {cpu::CpuIsa::scalar, cpu::CpuIsa::avx2, cpu::CpuIsa::avx512}) {
    if (!cpu::isa_supported(isa)) continue;
    for (KvType t : {KvType::f32, KvType::f16, KvType::q8_0}) {
      const cpu::AttendFn attend = cpu::cpu_kernels(isa).attend[size_t(t)];
      ASSERT_NE(attend, nullptr);
      for (const Case& c : cases) {
        if (!cpu::kv_type_fits(t, c.dk, c.dv)) continue;
        SCOPED_TRACE(std::string(cpu::isa_name(isa)) + " " + cpu::kv_type_name(t) + " rows " + std::to_string(c.rows) +
                     " dk " + std::to_string(c.dk) + " dv " + std::to_string(c.dv) + " keys [" +
                     std::to_string(c.first) + ", " + std::to_string(c.n) + ")");
        Entries e(t, c.dk, c.dv, c.n, rng);
        std::vector<float> q(size_t(c.rows * c.dk));
        for (float& x : q) x = rng.normal() * 0.3f;
        const std::vector<double> want = reference(t, e, q, c);
        double scale = 0;
        for (double x : want) scale = std::max(scale, std::abs(x));
        const double tolerance = isa != cpu::CpuIsa::scalar && t == KvType::q8_0 ? 4e-4 : 2e-5;
        for (int64_t split : {int64_t(1) << 20, int64_t(64)}) {
          const std::vector<float> got = run(attend, e, q, c, split);
          double worst = 0;
          for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(double(got[i]) - want[i]));
          EXPECT_LT(worst, tolerance * scale) << "split " << split;
        }
      }
    }
  }
}

// A prefill batch through attention_gqa (more tokens than a verification batch: the attend kernel
// over each block's shared keys, then each token's own) against a double softmax over the cache's
// entries widened, per head: causal, with a sliding window shorter and longer than a block of
// tokens, with sinks, for GQA groups whose token blocks hold 2, 5 and 16 tokens. Tolerance as
// above (q8_0 on AVX2 / AVX-512: the integer values' 4e-4).
TEST(AttentionGqa, PrefillMatchesDoubleSoftmax) {
  SEED_TRACE();
  Rng rng(44);
  struct Shape {
    int n_head, n_head_kv, n_swa;
    bool sinks;
  };
  const int64_t D = 64, pos0 = 70, n_tok = 40, ctx = pos0 + n_tok + 5;
  for (KvType t : {KvType::f16, KvType::q8_0})
    for (const Shape& sh : {Shape{16, 2, 0, false}, Shape{12, 4, 3, true}, Shape{4, 4, 50, false}, Shape{16, 2, 9, true}}) {
      SCOPED_TRACE(std::string(cpu::kv_type_name(t)) + " heads " + std::to_string(sh.n_head) + "/" +
                   std::to_string(sh.n_head_kv) + " window " + std::to_string(sh.n_swa) + (sh.sinks ? " sinks" : ""));
      KvCache cache;
      cache.init_key_blocks(1, int(ctx), sh.n_head_kv, int(D), int(sh.n_head_kv * D), t);
      std::vector<float> x(static_cast<size_t>(D));
      for (int hk = 0; hk < sh.n_head_kv; ++hk)
        for (int64_t j = 0; j < pos0 + n_tok; ++j) {
          for (float& e : x) e = rng.normal();
          cpu::kv_store_key(t, x.data(), D, cache.k_block_bytes(0, hk, j / KvCache::kKeyBlock), j % KvCache::kKeyBlock);
          for (float& e : x) e = rng.normal();
          cpu::kv_store_value(t, x.data(), D, cache.v_row_bytes(0, hk, j));
        }
      std::vector<float> q(size_t(n_tok * sh.n_head * D)), sinks(static_cast<size_t>(sh.n_head));
      for (float& e : q) e = rng.normal();
      for (float& e : sinks) e = 2.0f * rng.normal();
      const AttentionParams p{.n_head = sh.n_head, .n_head_kv = sh.n_head_kv, .head_dim_k = int(D), .head_dim_v = int(D),
                              .scale = 0.3f / std::sqrt(float(D)), .n_swa = sh.n_swa,
                              .sinks = sh.sinks ? sinks.data() : nullptr};
      std::vector<float> got(q.size());
      attention_gqa(p, cache, 0, q.data(), n_tok, pos0, got.data());
      const int group = sh.n_head / sh.n_head_kv;
      std::vector<float> qs(static_cast<size_t>(D)), kf(size_t(D * KvCache::kKeyBlock)), vf(static_cast<size_t>(D));
      std::vector<double> want(q.size(), 0.0);
      for (int64_t tk = 0; tk < n_tok; ++tk)
        for (int h = 0; h < sh.n_head; ++h) {
          const int hk = h / group;
          const int64_t pos = pos0 + tk, first = sh.n_swa > 0 ? std::max<int64_t>(0, pos - sh.n_swa + 1) : 0;
          for (int64_t d = 0; d < D; ++d) qs[size_t(d)] = q[size_t((tk * sh.n_head + h) * D + d)] * p.scale;
          cpu::kv_query(t, qs.data(), 1, D, qs.data());
          std::vector<double> sc;
          double mx = sh.sinks ? double(sinks[size_t(h)]) : -INFINITY;
          for (int64_t j = first; j <= pos; ++j) {
            cpu::kv_widen_keys(t, cache.k_block_bytes(0, hk, j / KvCache::kKeyBlock), D, kf.data());
            double acc = 0;
            for (int64_t d = 0; d < D; ++d) acc += double(qs[size_t(d)]) * kf[size_t(d * KvCache::kKeyBlock + j % KvCache::kKeyBlock)];
            sc.push_back(acc);
            mx = std::max(mx, acc);
          }
          double sum = sh.sinks ? std::exp(double(sinks[size_t(h)]) - mx) : 0.0;
          for (double v : sc) sum += std::exp(v - mx);
          double* o = &want[size_t((tk * sh.n_head + h) * D)];
          for (int64_t j = first; j <= pos; ++j) {
            cpu::kv_widen_values(t, cache.v_row_bytes(0, hk, j), cache.v_row_stride(), 1, D, vf.data());
            const double w = std::exp(sc[size_t(j - first)] - mx) / sum;
            for (int64_t d = 0; d < D; ++d) o[d] += w * vf[size_t(d)];
          }
        }
      double scale = 0, worst = 0;
      for (double v : want) scale = std::max(scale, std::abs(v));
      for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(double(got[i]) - want[i]));
      const double tolerance = t == KvType::q8_0 && cpu::cpu_kernels().isa != cpu::CpuIsa::scalar ? 4e-4 : 2e-5;
      EXPECT_LT(worst, tolerance * scale);
    }
}

// Prefill's integer scores over a q8_0 key block (KernelTable::scores_q8, where the ISA has it)
// against the query as kv_query gives it times the widened keys, in double; keys past n untouched.
// Tolerance: 1e-5 of the row's largest |score| (the group sums are exact, the scale products float).
TEST(AttendKernels, Q8ScoresMatchTheWidenedProduct) {
  SEED_TRACE();
  Rng rng(43);
  int checked = 0;
  for (cpu::CpuIsa isa : {cpu::CpuIsa::scalar, cpu::CpuIsa::avx2, cpu::CpuIsa::avx512}) {
    if (!cpu::isa_supported(isa) || cpu::cpu_kernels(isa).scores_q8 == nullptr) continue;
    ++checked;
    for (int64_t dk : {32, 128, 256})
      for (int rows : {1, 5, 8, 13})
        for (int64_t n : {32, 20, 7}) {
          SCOPED_TRACE(std::string(cpu::isa_name(isa)) + " dk " + std::to_string(dk) + " rows " + std::to_string(rows) +
                       " keys " + std::to_string(n));
          Entries e(KvType::q8_0, dk, 32, n, rng);
          std::vector<float> q(size_t(rows * dk));
          for (float& x : q) x = rng.normal();
          std::vector<int8_t> qi(q.size());
          std::vector<float> qd(q.size() / 32);
          std::vector<int32_t> off(qd.size());
          cpu::kv_quantize_query(q.data(), rows, dk, qi.data(), qd.data(), off.data());
          const int64_t lds = 40;
          std::vector<float> s(size_t(rows * lds), 7.0f);
          cpu::cpu_kernels(isa).scores_q8({qi.data(), qd.data(), off.data(), dk}, rows, e.k.data(), n, s.data(), lds);
          std::vector<float> qk(q.size());
          cpu::kv_query(KvType::q8_0, q.data(), rows, dk, qk.data());
          std::vector<float> kf(size_t(dk * cpu::kKvKeyBlock));
          cpu::kv_widen_keys(KvType::q8_0, e.k.data(), dk, kf.data());
          for (int r = 0; r < rows; ++r) {
            std::vector<double> want(static_cast<size_t>(n), 0.0);
            double scale = 0;
            for (int64_t j = 0; j < n; ++j) {
              for (int64_t d = 0; d < dk; ++d)
                want[size_t(j)] += double(qk[size_t(r * dk + d)]) * kf[size_t(d * cpu::kKvKeyBlock + j)];
              scale = std::max(scale, std::abs(want[size_t(j)]));
            }
            for (int64_t j = 0; j < n; ++j) EXPECT_NEAR(s[size_t(r * lds + j)], want[size_t(j)], 1e-5 * scale) << r << " " << j;
            for (int64_t j = n; j < lds; ++j) EXPECT_EQ(s[size_t(r * lds + j)], 7.0f) << "wrote past key " << n;
          }
        }
  }
  if (checked == 0) GTEST_SKIP() << "no ISA of this CPU has scores_q8 (AVX-512 VNNI)";
}

// q8_0 entries round trip within half a quantization step of their group's scale (and its rounding).
TEST(KvFormat, Q8KeysAndValuesRoundTrip) {
  SEED_TRACE();
  Rng rng(42);
  const int64_t dk = 64, kb = cpu::kKvKeyBlock;
  std::vector<uint8_t> blk(cpu::kv_key_block_bytes(KvType::q8_0, dk)), row(cpu::kv_value_row_bytes(KvType::q8_0, dk));
  std::vector<float> x(static_cast<size_t>(dk)), kf(static_cast<size_t>(dk * kb)), vf(static_cast<size_t>(dk));
  for (float& v : x) v = rng.normal();
  cpu::kv_store_key(KvType::q8_0, x.data(), dk, blk.data(), 5);
  cpu::kv_store_value(KvType::q8_0, x.data(), dk, row.data());
  cpu::kv_widen_keys(KvType::q8_0, blk.data(), dk, kf.data());
  cpu::kv_widen_values(KvType::q8_0, row.data(), row.size(), 1, dk, vf.data());
  for (int64_t g = 0; g < dk / 32; ++g) {
    float amax = 0;
    for (int64_t i = 0; i < 32; ++i) amax = std::max(amax, std::abs(x[size_t(g * 32 + i)]));
    for (int64_t i = g * 32; i < g * 32 + 32; ++i) {
      // half a step, plus the half-precision scale's rounding (2^-11 relative) times up to 127 steps
      EXPECT_NEAR(kf[size_t(i * kb + 5)], x[size_t(i)], 0.6f * amax / 127);
      EXPECT_EQ(kf[size_t(i * kb + 5)], vf[size_t(i)]);  // keys and values quantize alike
    }
  }
  EXPECT_EQ(cpu::kv_key_block_bytes(KvType::q8_0, 128) / size_t(kb), 136u);  // 34 bytes per 32 dims
  EXPECT_EQ(cpu::kv_value_row_bytes(KvType::q8_0, 128), 136u);
  // the attend kernels' q8_0 query buffers hold up to kAttendQ8MaxDim dims: wider keys keep f16
  EXPECT_TRUE(cpu::kv_type_fits(KvType::q8_0, cpu::kAttendQ8MaxDim, 64));
  EXPECT_FALSE(cpu::kv_type_fits(KvType::q8_0, cpu::kAttendQ8MaxDim + 32, 64));
  EXPECT_FALSE(cpu::kv_type_fits(KvType::q8_0, 80, 64));
}

}  // namespace
}  // namespace strata
