// One sequence being evaluated: the model, its KV cache, and the position reached.
// Not thread-safe: one caller at a time (the kernels inside use the OpenMP threads).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/error.h"
#include "model/backend.h"
#include "model/experts.h"
#include "model/kv_cache.h"
#include "model/model.h"

namespace strata {

class Engine;

class Session {
 public:
  // A sequence of `engine`'s model, run on what the engine built (its backend on the quantized
  // path, its tiers of routed experts, its routing override). The engine outlives the session.
  // path: quantized activations (default, llama.cpp's CPU math) or the exact float reference.
  // kv: the KV cache entries; the exact path always keeps float (it is the oracle).
  Session(const Engine& engine, int n_ctx, cpu::MatmulPath path = cpu::MatmulPath::quantized,
          KvType kv = KvType::f16);
  // A sequence of `model` alone: the CPU backend, every expert from the model's weights.
  Session(const Model& model, int n_ctx, cpu::MatmulPath path = cpu::MatmulPath::quantized,
          KvType kv = KvType::f16);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Evaluates `tokens` at positions n_past() .. and appends them to the cache. Returns the logits
  // of every token ([n][n_vocab]) when all_logits, else those of the last token ([n_vocab]).
  // Errors: empty input, a token id outside the vocabulary, or the context would overflow.
  Result<std::vector<float>> eval(std::span<const int32_t> tokens, bool all_logits = false);
  // One forward pass over several sequences (continuous batching): tokens[s] are evaluated in
  // sessions[s] (distinct sessions of one model and path), every weight read once for all of
  // them. Returns the logits of the last token of each sequence ([n][n_vocab]), or with
  // all_logits those of every token, sequence after sequence (speculative verification in the
  // server). Errors as eval, and then no session advances.
  static Result<std::vector<float>> eval_batch(std::span<Session* const> sessions,
                                               std::span<const std::vector<int32_t>> tokens, bool all_logits = false);

  int64_t n_past() const { return n_past_; }
  int n_ctx() const { return cache_.n_ctx; }
  KvType kv_type() const { return cache_.type; }
  cpu::MatmulPath path() const { return backend_.path(); }
  // What this session's dense ops run on: the engine's backend on the quantized path when it has
  // one (the CUDA backend), else the session's own CpuBackend.
  const Backend& backend() const;
  // What its forward passes run on: backend(), the routed experts and the routing override.
  Exec exec() const;
  void reset() {
    n_past_ = 0;
    checkpoint_pos_ = -1;
  }
  // Forgets every position from n on (their cache rows are overwritten by the next eval). Returns
  // the positions kept: n where the cache can resume there, else less. Caches that only append
  // rows resume anywhere. deepseek4's compressors keep only the tokens of their open blocks in
  // rings: they resume at n when no ring slot those blocks need was overwritten since (n in the
  // blocks still open at n_past()), else at the last checkpoint() at or below n, else at 0.
  int64_t truncate(int64_t n);
  // Remembers the compressor rings at n_past(), where a later truncate may resume (the server
  // checkpoints each prompt's end: the next turn's prompt usually extends it). Free for caches
  // without compressors.
  void checkpoint();
  // Speculative decoding: verify drafted tokens in one eval, then rewind to the accepted prefix.
  // begin_speculation() remembers the per-layer state the next tokens may overwrite (deepseek4's
  // compressor rings; other caches only append rows); rewind(n) then forgets the positions from n
  // on exactly, for any n between the position at begin_speculation() and n_past(), provided at
  // most max_speculation() tokens were evaluated since.
  void begin_speculation();
  void rewind(int64_t n);
  // Most tokens one speculative eval may hold and still rewind exactly: the smallest compressor
  // ring (deepseek4's ratio-4 layers keep 8 tokens), else the context.
  int max_speculation() const;
  const Model& model() const { return model_; }

  // Keeps the last layer's output row (before the final norm) of every position eval computes,
  // until released: what the MTP drafter reads. Off by default.
  void keep_hidden(bool on);
  // The kept row [n_embd] of position pos, or null when it is not kept (or pos >= n_past()).
  const float* hidden_row(int64_t pos) const;
  // Frees the kept rows of the positions below pos.
  void release_hidden(int64_t pos);

 private:
  // The errors of eval: no tokens, an id outside the vocabulary, a full context.
  Status check(std::span<const int32_t> tokens) const;
  Status forward_error() const;
  static void step_done(std::span<Session* const> sessions);
  // keep_hidden: appends the rows [n][n_embd] of the n positions from n_past_ on.
  void keep_rows(const float* rows, int64_t n);
  const Model& model_;
  const Engine* engine_ = nullptr;  // null: the model alone
  CpuBackend backend_;
  KvCache cache_;
  int64_t n_past_ = 0;
  // begin_speculation's copy of the compressor rings ([layer][attn, index] -> ring_a, ring_s)
  int64_t spec_pos_ = -1;
  std::vector<std::vector<float>> spec_rings_;
  // checkpoint()'s copy, made at position checkpoint_pos_ (-1: none)
  int64_t checkpoint_pos_ = -1;
  std::vector<std::vector<float>> checkpoint_rings_;
  std::vector<std::vector<float>> copy_rings() const;
  // keep_hidden: the rows of positions hidden_pos0_ .. hidden_pos0_ + rows - 1
  bool keep_hidden_ = false;
  int64_t hidden_pos0_ = 0;
  std::vector<float> hidden_;
};

// Index of the largest logit; ties go to the lowest id (as the fixtures' greedy files do).
int32_t argmax(std::span<const float> logits);

}  // namespace strata
