#include "cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "base/error.h"
#include "cpu/kernels.h"
#include "cpu/onednn_matmul.h"
#include "cpu/quant_traits.h"
#include "cpu/repack.h"
#include "cpu/thread_pool.h"

namespace strata::cpu {

namespace {

// Dot of a dequantized weight row with tokens; the inner loop vectorises.
inline float dot(const float* a, const float* b, int64_t n) {
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

}  // namespace

GgmlType Matmul::act_type(GgmlType weight_type) const {
  return path_ == MatmulPath::exact ? GgmlType::f32 : quant_traits(weight_type).vec_dot_type;
}

size_t Matmul::act_row_bytes(GgmlType weight_type, int64_t n_in) const {
  const GgmlType act = act_type(weight_type);
  return act == GgmlType::f32 ? size_t(n_in) * sizeof(float) : ggml_row_bytes(act, uint64_t(n_in));
}

void Matmul::prepare_row(GgmlType weight_type, const float* x, int64_t n_in, uint8_t* out) const {
  const GgmlType act = act_type(weight_type);
  if (act == GgmlType::f32) {
    std::memcpy(out, x, size_t(n_in) * sizeof(float));
    return;
  }
  STRATA_CHECK(n_in % int64_t(quant_traits(weight_type).block_size) == 0 &&
                   n_in % int64_t(quant_traits(act).block_size) == 0,
               "row length is not a whole number of blocks (the kernels do not check)");
  const QuantizeRowFn quantize = cpu_kernels().quantize(act);
  STRATA_CHECK(quantize != nullptr, "vec_dot_type without a quantizer");
  quantize(x, out, n_in);
}

ActRows Matmul::prepare(GgmlType weight_type, const float* x, int64_t n_tok, int64_t n_in,
                            std::vector<uint8_t>& buf) const {
  const size_t row_bytes = act_row_bytes(weight_type, n_in);
  buf.resize(row_bytes * size_t(n_tok));
  uint8_t* out = buf.data();
  compute_pool().run(n_tok, [&](int64_t t, int) {
    prepare_row(weight_type, x + t * n_in, n_in, out + size_t(t) * row_bytes);
  });
  return ActRows{buf.data(), row_bytes, n_tok};
}

void Matmul::tile(const Weight& w, int64_t r0, int64_t r1, const ActRows& a, float* y,
                      int64_t ldy) const {
  if (r1 <= r0 || a.n_tok == 0) return;
  if (path_ == MatmulPath::quantized) {
    const KernelTable& k = cpu_kernels();
    if (w.interleaved) {
      // the whole groups with the interleaved kernel, then the rows past them (file layout)
      const int64_t g1 = std::min(r1, w.n_out / kInterleaveRows * kInterleaveRows);
      if (r0 < g1) {
        STRATA_CHECK(r0 % kInterleaveRows == 0 && g1 % kInterleaveRows == 0,
                     "a tile of row-interleaved weights cuts a group of 16 rows");
        const GemmFn g = k.gemm_interleaved[size_t(w.type)];
        STRATA_CHECK(g != nullptr, "interleaved weights without an interleaved kernel");
        g(w.n_in, w.row(r0), w.row_bytes, g1 - r0, a.data, a.row_bytes, a.n_tok, y, ldy);
        y += g1 - r0;
        r0 = g1;
      }
      if (r0 >= r1) return;
    }
    k.gemm_tile(w.type, w.n_in, w.row(r0), w.row_bytes, r1 - r0, a.data, a.row_bytes, a.n_tok, y, ldy);
    return;
  }
  // exact: each row dequantized once for all tokens
  const QuantTraits& qt = quant_traits(w.type);
  STRATA_CHECK(qt.dequantize_row != nullptr, "weight type without dequantize (loader must reject)");
  thread_local std::vector<float> row;
  thread_local std::vector<uint8_t> packed;
  row.resize(size_t(w.n_in));
  packed.resize(w.row_bytes);
  for (int64_t r = r0; r < r1; ++r) {
    qt.dequantize_row(file_row(w, r, 0, packed.data()), row.data(), w.n_in);
    for (int64_t t = 0; t < a.n_tok; ++t)
      y[t * ldy + (r - r0)] = dot(row.data(), reinterpret_cast<const float*>(a.row(t)), w.n_in);
  }
}

std::vector<int64_t> Matmul::guided_rows(int64_t total, int n_threads, int64_t min_rows) {
  min_rows = std::max<int64_t>(16, (min_rows + 15) / 16 * 16);
  std::vector<int64_t> rows;
  for (int64_t left = total; left > 0;) {
    const int64_t share = (left / (2 * int64_t(n_threads)) + 15) / 16 * 16;
    const int64_t n = std::min(left, std::max(min_rows, share));
    rows.push_back(n);
    left -= n;
  }
  return rows;
}

std::vector<Matmul::RowRange> Matmul::guided_ranges(std::span<const int64_t> parts, int n_threads,
                                                   int64_t min_rows) {
  int64_t total = 0;
  for (int64_t p : parts) total += p;
  std::vector<RowRange> out;
  size_t i = 0;
  int64_t r0 = 0;
  for (int64_t n : guided_rows(total, n_threads, min_rows)) {
    while (n > 0) {
      while (i < parts.size() && r0 == parts[i]) {  // the next part, from row 0
        ++i;
        r0 = 0;
        n = (n + 15) / 16 * 16;
      }
      if (i == parts.size()) break;
      const int64_t r1 = std::min(parts[i], r0 + n);
      out.push_back({int64_t(i), r0, r1});
      n -= r1 - r0;
      r0 = r1;
    }
  }
  return out;
}

int64_t Matmul::min_task_rows(size_t row_bytes) {
  return int64_t(kMinTaskBytes / std::max<size_t>(row_bytes, 1));
}

void Matmul::matmul(const Weight& w, const float* x, int64_t n_tok, float* y) const {
  const MatmulOut out{&w, y};
  matmul_batch(std::span<const MatmulOut>(&out, 1), x, n_tok);
}

void Matmul::matmul_batch(std::span<const MatmulOut> outs, const float* x, int64_t n_tok) const {
  if (n_tok == 0 || outs.empty()) return;
  // activations prepared once per distinct format (the weights' vec_dot types)
  thread_local std::vector<uint8_t> bufs[4];
  std::vector<std::pair<GgmlType, ActRows>> prepared;
  std::vector<ActRows> acts(outs.size());
  // BF16 weights and many tokens: oneDNN's matmul where it is faster (cpu/onednn_matmul.h)
  std::vector<char> done(outs.size(), 0);
  if (path_ == MatmulPath::quantized && n_tok >= kOnednnMinTokens)
    for (size_t i = 0; i < outs.size(); ++i)
      if (outs[i].w->type == GgmlType::bf16)
        done[i] = onednn_matmul_bf16(*outs[i].w, x, n_tok, outs[i].y, outs[i].w->n_out);
  for (size_t i = 0; i < outs.size(); ++i) {
    const Weight& w = *outs[i].w;
    STRATA_CHECK(w.n_in == outs[0].w->n_in, "a matmul batch shares one input");
    if (done[i]) continue;
    const GgmlType f = act_type(w.type);
    auto it = std::find_if(prepared.begin(), prepared.end(), [f](const auto& p) { return p.first == f; });
    if (it == prepared.end()) {
      STRATA_CHECK(prepared.size() < std::size(bufs), "more than 4 activation formats in one matmul batch");
      prepared.emplace_back(f, prepare(w.type, x, n_tok, w.n_in, bufs[prepared.size()]));
      it = prepared.end() - 1;
    }
    acts[i] = it->second;
  }
  // Few tokens: the weights are the traffic; long row chunks. Many: tiles of up to kTileRows rows by
  // kTileTokens tokens, whose weights and activations both stay in L2 while the tile kernel
  // reuses them.
  ThreadPool& pool = compute_pool();
  struct Task {
    uint32_t out;
    int64_t r0, r1, t0, t1;
  };
  const bool tiled = n_tok >= kTileMinTokens;
  std::vector<Task> tasks;
  if (tiled) {
    tasks = tiled_tasks(pool.size(), tiled, [&](int64_t tile_rows) {
      std::vector<Task> v;
      for (size_t i = 0; i < outs.size(); ++i) {
        if (done[i]) continue;
        const int64_t n_out = outs[i].w->n_out;
        for (int64_t t0 = 0; t0 < n_tok; t0 += kTileTokens)
          for (int64_t r0 = 0; r0 < n_out; r0 += tile_rows)
            v.push_back({uint32_t(i), r0, std::min(n_out, r0 + tile_rows), t0, std::min(n_tok, t0 + kTileTokens)});
      }
      return v;
    });
  } else {
    // guided over the matrices' rows one after another, each task within one matrix
    std::vector<int64_t> rows(outs.size(), 0);
    size_t bytes = 0;
    for (size_t i = 0; i < outs.size(); ++i) {
      if (done[i]) continue;
      rows[i] = outs[i].w->n_out;
      bytes += size_t(rows[i]) * outs[i].w->row_bytes;
    }
    const int64_t total_rows = std::accumulate(rows.begin(), rows.end(), int64_t(0));
    const int64_t min_rows = min_task_rows(bytes / size_t(std::max<int64_t>(total_rows, 1)));
    for (const RowRange& r : guided_ranges(rows, pool.size(), min_rows))
      tasks.push_back({uint32_t(r.part), r.r0, r.r1, 0, n_tok});
  }
  pool.run(int64_t(tasks.size()), [&](int64_t k, int) {
    const Task& t = tasks[size_t(k)];
    const Weight& w = *outs[t.out].w;
    const ActRows& a = acts[t.out];
    tile(w, t.r0, t.r1, ActRows{a.row(t.t0), a.row_bytes, t.t1 - t.t0}, outs[t.out].y + t.t0 * w.n_out + t.r0, w.n_out);
  });
}

void get_row(const Weight& w, int64_t row, float* out) {
  const QuantTraits& qt = quant_traits(w.type);
  STRATA_CHECK(qt.dequantize_row != nullptr);
  STRATA_CHECK(row >= 0 && row < w.n_out, "row out of range");
  thread_local std::vector<uint8_t> packed;
  packed.resize(w.row_bytes);
  qt.dequantize_row(file_row(w, row, 0, packed.data()), out, w.n_in);
}

void rms_norm(const float* x, const float* weight, int64_t n, float eps, float* out) {
  double ss = 0;  // ggml sums squares in ggml_float (double); in lanes here (a serial sum was 1.7% of a prefill)
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * double(x[i]);
  const float scale = 1.0f / std::sqrt(float(ss / double(n)) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * (weight ? weight[i] : 1.0f);
}

float dot_f32(const float* a, const float* b, int64_t n) {
  static const VecDotFn f32_dot = cpu_kernels().dot(GgmlType::f32);
  return f32_dot(n, a, b);
}

void add(float* y, const float* x, int64_t n) { cpu_kernels().axpy(y, x, 1.0f, n); }

float max_value(const float* x, int64_t n, float init) {
  float mx = init;  // in lanes: a serial maxss chain was most of a 512-token prefill's softmax time
#pragma omp simd reduction(max : mx)
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  return mx;
}

void softmax(float* x, int64_t n) {
  const float mx = max_value(x, n);
  static const ExpSumFn exp_sum = cpu_kernels().exp_sum;
  const float inv = 1.0f / exp_sum(x, x, n, mx);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

float exp_sum(float* x, int64_t n, float max) {
  static const ExpSumFn f = cpu_kernels().exp_sum;
  return f(x, x, n, max);
}

namespace {

// ggml's rope_yarn_corr_dim: the dimension at which the rotation count at n_ctx_orig is `n_rot`.
float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
  return n_dims * std::log(n_ctx_orig / (n_rot * 2 * float(M_PI))) / (2 * std::log(base));
}

}  // namespace

void rope(float* x, int n_head, int head_dim, int64_t pos, const RopeParams& p) {
  const int n_rot = p.n_rot;
  STRATA_CHECK(n_rot > 0 && n_rot <= head_dim && n_rot % 2 == 0);
  const float theta_scale = std::pow(p.freq_base, -2.0f / float(n_rot));
  float corr_low = 0, corr_high = 0;
  const bool yarn = p.ext_factor != 0.0f;
  if (yarn) {
    corr_low = std::max(0.0f, std::floor(yarn_corr_dim(n_rot, p.n_ctx_orig, p.beta_fast, p.freq_base)));
    corr_high = std::min(float(n_rot - 1), std::ceil(yarn_corr_dim(n_rot, p.n_ctx_orig, p.beta_slow, p.freq_base)));
  }
  const float freq_scale = 1.0f / p.factor;
  float mscale = p.attn_factor;
  if (yarn) mscale *= 1.0f + 0.1f * std::log(1.0f / freq_scale);

  // the pairs' cos and sin first (once for all heads), then each head's pairs in order: the
  // rotation in vectors (neox: the two halves of a head; norm: pairs of neighbours), where the
  // pairs outside and heads inside made a strided scalar loop (1% of pp512's time)
  const int half = n_rot / 2;
  thread_local std::vector<float> cs;
  cs.resize(size_t(n_rot));
  float* cv = cs.data();
  float* sv = cs.data() + half;
  float theta_extrap = float(pos);
  for (int i = 0; i < half; ++i) {
    // ggml's rope_yarn for pair i (i0 = 2i)
    const float theta_interp = freq_scale * theta_extrap;
    float theta = theta_interp;
    if (yarn) {
      const float y = (float(i) - corr_low) / std::max(0.001f, corr_high - corr_low);
      const float ramp = 1.0f - std::min(1.0f, std::max(0.0f, y));
      const float ramp_mix = ramp * p.ext_factor;
      theta = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix;
    }
    cv[i] = std::cos(theta) * mscale;
    sv[i] = std::sin(theta) * mscale;
    theta_extrap *= theta_scale;
  }
  for (int h = 0; h < n_head; ++h) {
    float* v = x + size_t(h) * head_dim;
    if (p.kind == RopeKind::neox) {
      float* va = v;
      float* vb = v + half;
      for (int i = 0; i < half; ++i) {
        const float x0 = va[i], x1 = vb[i];
        va[i] = x0 * cv[i] - x1 * sv[i];
        vb[i] = x0 * sv[i] + x1 * cv[i];
      }
    } else {
      for (int i = 0; i < half; ++i) {
        const float x0 = v[2 * i], x1 = v[2 * i + 1];
        v[2 * i] = x0 * cv[i] - x1 * sv[i];
        v[2 * i + 1] = x0 * sv[i] + x1 * cv[i];
      }
    }
  }
}

}  // namespace strata::cpu
