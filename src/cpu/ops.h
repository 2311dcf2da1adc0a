// Ops of the forward pass on the CPU. Activations are float rows; weights are Weight views in any
// supported format. The matmul has two paths (Matmul):
//  - exact: each weight row dequantized, times float activations (how ../shared/fixtures'
//    logits-*.exact.f32 were computed); the engine's own oracle;
//  - quantized (default): activations rounded to the weight type's vec_dot type (Q8_0 / Q8_K /
//    float, as llama.cpp's CPU path does) and dotted with the format's kernel from the SIMD table
//    chosen at start-up (cpu/kernels.h: AVX-512, AVX2, or the scalar reference).
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "cpu/weights.h"

namespace strata::cpu {

enum class MatmulPath { exact, quantized };

// Activation rows prepared for weights of one type: in the type's vec_dot format (quantized path)
// or float (exact path). A view; the bytes belong to the buffer given to Matmul::prepare.
struct ActRows {
  const uint8_t* data = nullptr;  // [n_tok][row_bytes]
  size_t row_bytes = 0;
  int64_t n_tok = 0;
  const uint8_t* row(int64_t t) const { return data + size_t(t) * row_bytes; }
};

class Matmul {
 public:
  explicit Matmul(MatmulPath path = MatmulPath::quantized) : path_(path) {}
  MatmulPath path() const { return path_; }

  // y[t][0..n_out) = W x[t] for t < n_tok. x: [n_tok][w.n_in], y: [n_tok][w.n_out] (no aliasing).
  // Activations prepared once; row chunks of W are tasks of compute_pool().
  void matmul(const Weight& w, const float* x, int64_t n_tok, float* y) const;
  // Several matrices of the same input in one dispatch (q, k and v of attention): y_i = W_i x,
  // activations prepared once per activation format, every matrix's row chunks from one counter.
  struct MatmulOut {
    const Weight* w;
    float* y;  // [n_tok][w->n_out]
  };
  void matmul_batch(std::span<const MatmulOut> outs, const float* x, int64_t n_tok) const;

  // The two halves of matmul, for callers that batch several matrices into one dispatch (the
  // expert FFN). prepare: x [n_tok][n_in] for weights of type `weight_type`, into buf (resized;
  // rows may be prepared in parallel on compute_pool()). act_row_bytes: the size of one prepared
  // row.
  size_t act_row_bytes(GgmlType weight_type, int64_t n_in) const;
  // The format activations take for weights of `weight_type`: f32 on the exact path or where the
  // type's vec_dot takes floats, else its vec_dot_type (Q8_0 / Q8_K / ...).
  GgmlType act_type(GgmlType weight_type) const;
  ActRows prepare(GgmlType weight_type, const float* x, int64_t n_tok, int64_t n_in,
                  std::vector<uint8_t>& buf) const;
  // One row of prepare, on the calling thread: out[0..act_row_bytes(weight_type, n_in)).
  void prepare_row(GgmlType weight_type, const float* x, int64_t n_in, uint8_t* out) const;
  // One task's share: y[t * ldy + (r - r0)] = (row r of W) . a[t] for r in [r0, r1), t < a.n_tok,
  // on the calling thread. W is a 2D weight (a slice of a stack); a was prepared for W's type.
  void tile(const Weight& w, int64_t r0, int64_t r1, const ActRows& a, float* y, int64_t ldy) const;

  // Few tokens (decode): the row counts of the tasks that cut `total` rows for n_threads taking
  // them in order (guided scheduling): each a 1 / (2 n_threads) share of the rows still left,
  // a multiple of 16 (the kernels' row group), at least min_rows (a short task pays its start
  // from DRAM, a few hundred nanoseconds). The first tasks are long, the last short, so the
  // threads finish within a short task of each other: with four even tasks a thread, one thread
  // waited 23-26 us a dispatch for the other's last (30B-A3B decode's q/k/v, o, router and head;
  // rdtsc counts in ThreadPool::dispatch), 5-7 us guided.
  static std::vector<int64_t> guided_rows(int64_t total, int n_threads, int64_t min_rows);
  // guided_rows over parts of parts[i] rows one after another (several matrices, or experts):
  // each task within one part, rows [r0, r1) of part `part`; what a part's end cuts off a task
  // goes on in the next part (rounded up to 16 rows). Parts of 0 rows get no task.
  struct RowRange {
    int64_t part, r0, r1;
  };
  static std::vector<RowRange> guided_ranges(std::span<const int64_t> parts, int n_threads, int64_t min_rows);
  // min_rows of guided_rows for rows of row_bytes bytes: kMinTaskBytes of them
  static constexpr size_t kMinTaskBytes = 64 * 1024;
  static int64_t min_task_rows(size_t row_bytes);
  // From kTileMinTokens activation rows on, matmuls are cut into tiles of up to kTileRows weight
  // rows by kTileTokens activation rows. A tile's first 16-row group waits on DRAM (the kernels
  // prefetch only within a tile), so tiles are long: 256 rows made a 512-token prefill of the
  // 30B-A3B synthetic model 95 -> 103 tok/s against 64. 128 tokens (300 KB of Q8_K activations
  // at 2048 wide, in L2) measured 7% faster than 64 and equal to 256 (BM_gemm q4_K/512).
  static constexpr int64_t kTileMinTokens = 16, kTileRows = 256, kTileTokens = 128;
  // The tasks make(rows) cuts with tiles of `rows` weight rows: kTileRows, halved down to 64 while
  // the tasks would leave a thread fewer than four (one 768-row matrix in three tiles for two
  // threads: a third of the time one thread idles). tiled: whether make has tiles at all.
  template <class MakeTasks>
  static auto tiled_tasks(int n_threads, bool tiled, MakeTasks&& make) {
    int64_t rows = kTileRows;
    auto tasks = make(rows);
    while (tiled && rows > 64 && int64_t(tasks.size()) < 4 * int64_t(n_threads)) tasks = make(rows /= 2);
    return tasks;
  }

 private:
  MatmulPath path_;
};

// One row of a token table (embeddings) dequantized into out[0..w.n_in).
void get_row(const Weight& w, int64_t row, float* out);

// out = x / sqrt(mean(x^2) + eps) * weight (weight may be null: no scale). n elements; may alias.
void rms_norm(const float* x, const float* weight, int64_t n, float eps, float* out);

// y += x
void add(float* y, const float* x, int64_t n);

// sum_i a[i] b[i], with the start-up ISA's f32 kernel (attention scores).
float dot_f32(const float* a, const float* b, int64_t n);

// The largest of x[0..n) and `init` (in SIMD lanes).
float max_value(const float* x, int64_t n, float init = -INFINITY);
// Softmax of x[0..n) in place (exp by the start-up ISA's exp_sum).
void softmax(float* x, int64_t n);
// x[i] = exp(x[i] - max) in place; returns their sum (kernels.h ExpSumFn).
float exp_sum(float* x, int64_t n, float max);

// RoPE. A head of `head_dim` values; the first `n_rot` are rotated (the rest pass through).
// NEOX pairs (i, i + n_rot/2); NORM pairs (2i, 2i+1). Angle for pair i: pos * base^(-2i/n_rot),
// with YaRN when yarn.factor > 1 (ggml's rope_yarn; see ../shared/fixtures/README.md).
enum class RopeKind { norm, neox };
struct RopeParams {
  RopeKind kind = RopeKind::neox;
  int n_rot = 0;
  float freq_base = 10000.0f;
  // YaRN (factor 1 = off)
  float factor = 1.0f;
  int n_ctx_orig = 0;
  float beta_fast = 32.0f, beta_slow = 1.0f;
  float ext_factor = 0.0f;    // 1 when YaRN ramps are on (ggml's ext_factor)
  float attn_factor = 1.0f;   // cos / sin multiplied by attn_factor * (1 + 0.1 ln factor) if ext
};
// Rotates n_head heads of one token at position `pos` in place: x[h * head_dim + i].
void rope(float* x, int n_head, int head_dim, int64_t pos, const RopeParams& p);

}  // namespace strata::cpu
