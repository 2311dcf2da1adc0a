#include "cpu/kernel_probe.h"

#include <atomic>
#include <chrono>
#include <random>
#include <vector>

#include "cpu/ops.h"
#include "cpu/quant_blocks.h"
#include "cpu/repack.h"
#include "cpu/weights.h"

namespace strata::cpu {
namespace {

constexpr int64_t kIn = 2048, kOut = 768;

// A stack of `n_mat` random Q4_K matrices [kOut][kIn]: random quants and sub-block scales, super-
// block scales of moderate size (no NaN, no denormal), filled by the pool's threads (first touch).
struct Stack {
  std::vector<block_q4_K> blocks;
  Weight w;
  Stack(ThreadPool& pool, int64_t n_mat) {
    const int64_t per_row = kIn / QK_K;
    const int64_t n_rows = n_mat * kOut;
    blocks.resize(size_t(n_rows * per_row));
    pool.run(pool.size(), [&](int64_t task, int) {
      std::mt19937 rng(1234 + task);
      const int64_t r0 = n_rows * task / pool.size(), r1 = n_rows * (task + 1) / pool.size();
      for (int64_t i = r0 * per_row; i < r1 * per_row; ++i) {
        block_q4_K& b = blocks[size_t(i)];
        b.d = 0x2C00;     // 1/16
        b.dmin = 0x2400;  // 1/64
        for (auto& s : b.scales) s = uint8_t(rng());
        for (auto& q : b.qs) q = uint8_t(rng());
      }
    });
    w.data = reinterpret_cast<const uint8_t*>(blocks.data());
    w.type = GgmlType::q4_k;
    w.n_in = kIn;
    w.n_out = kOut;
    w.n_mat = n_mat;
    w.row_bytes = size_t(per_row) * sizeof(block_q4_K);
  }
};

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

double measure_weights_gbps(ThreadPool& pool, size_t bytes, double seconds) {
  const size_t mat_bytes = size_t(kOut) * size_t(kIn / QK_K) * sizeof(block_q4_K);
  const int64_t n_mat = std::max<int64_t>(16, int64_t(bytes / mat_bytes));
  Stack s(pool, n_mat);
  const Matmul be(MatmulPath::quantized);
  std::vector<float> x(static_cast<size_t>(kIn));
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (float& v : x) v = nd(rng);
  constexpr int kBatch = 16;
  std::vector<Weight> slices(kBatch);
  std::vector<std::vector<float>> ys(kBatch, std::vector<float>(size_t(kOut)));
  std::vector<Matmul::MatmulOut> outs(kBatch);
  double best = 0;
  for (int pass = 0; pass < 3; ++pass) {
    size_t read = 0;
    const auto t0 = std::chrono::steady_clock::now();
    while (since(t0) < seconds / 3) {
      for (int i = 0; i < kBatch; ++i) {
        slices[size_t(i)] = s.w.slice(int64_t(rng() % uint64_t(n_mat)));
        outs[size_t(i)] = {&slices[size_t(i)], ys[size_t(i)].data()};
      }
      be.matmul_batch(outs, x.data(), 1);
      read += kBatch * mat_bytes;
    }
    best = std::max(best, double(read) / since(t0) / 1e9);
  }
  return best;
}

double measure_interleave_gbps(ThreadPool& pool, size_t bytes, double seconds, GgmlType* measured) {
  const size_t q4k_bytes = size_t(kOut) * size_t(kIn / QK_K) * sizeof(block_q4_K);
  const int64_t n_mat = std::max<int64_t>(4 * pool.size(), int64_t(bytes / q4k_bytes));
  Stack s(pool, n_mat);
  // Q4_K where the kernels interleave it, else a 4-bit 32-element format they do interleave (AVX2)
  // over the same bytes, whose content does not matter to the rate (each row no longer than
  // Q4_K's, so the stack holds its matrices)
  Weight w = s.w;
  bool found = false;
  for (GgmlType t : {GgmlType::q4_k, GgmlType::mxfp4, GgmlType::q4_0, GgmlType::iq4_nl}) {
    w.type = t;
    w.row_bytes = ggml_row_bytes(t, uint64_t(kIn));
    if ((found = w.row_bytes <= s.w.row_bytes && can_interleave(w.slice(0)))) break;
  }
  if (measured != nullptr) *measured = found ? w.type : GgmlType::q4_k;
  if (!found) return 0.0;
  const size_t mat_bytes = size_t(kOut) * w.row_bytes;
  double best = 0;
  for (int pass = 0; pass < 3; ++pass) {
    std::atomic<int64_t> done{0};
    const auto t0 = std::chrono::steady_clock::now();
    pool.run(pool.size(), [&](int64_t task, int) {
      std::mt19937 rng(uint32_t(100 * pass + task));
      int64_t n = 0;
      while (since(t0) < seconds / 3) {
        // the bytes' content does not matter to the rate: a matrix already interleaved is
        // interleaved again as if it were in the file's layout
        Weight m = w.slice(int64_t(rng() % uint64_t(n_mat)));
        interleave(m, const_cast<uint8_t*>(m.data), /*on_pool=*/false);
        ++n;
      }
      done.fetch_add(n, std::memory_order_relaxed);
    });
    best = std::max(best, double(done.load()) * double(mat_bytes) / since(t0) / 1e9);
  }
  return best;
}

double measure_gemm_gops(ThreadPool& pool, double seconds) {
  constexpr int64_t kMats = 8, kTok = 64;
  Stack s(pool, kMats);
  const Matmul be(MatmulPath::quantized);
  std::vector<float> x(size_t(kIn * kTok)), y(size_t(kOut * kTok));
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  for (float& v : x) v = nd(rng);
  double best = 0;
  for (int pass = 0; pass < 3; ++pass) {
    double ops = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; since(t0) < seconds / 3; ++i) {
      be.matmul(s.w.slice(i % kMats), x.data(), kTok, y.data());
      ops += 2.0 * double(kIn) * double(kOut) * double(kTok);
    }
    best = std::max(best, ops / since(t0) / 1e9);
  }
  return best;
}

}  // namespace strata::cpu
