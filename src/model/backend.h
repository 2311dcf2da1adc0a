// The ops a forward pass needs (../shared/DESIGN.md "Interfaces"): the architectures' forward
// passes (arch_*.cpp) are written once against Backend, and run unchanged on the CPU (CpuBackend,
// below) or with their dense part on a CUDA device (gpu/cuda_backend.h).
//
// Activations are float rows in host memory on every backend, and the KV cache is the host's
// KvCache: a device backend copies an op's inputs in and its outputs out (the hidden state crosses
// PCIe per op, not once per layer; device-resident activations are the next step of #7,
// docs/gpu.md), and may keep a copy of the cache's rows (release_cache). What a backend has no op for (deepseek4's compressors and indexer, hash-routed
// layers' routing, embedding rows) runs on the host in the forward pass itself, on the same rows.
// The routed experts are RoutedExperts' (model/experts.h), which compute the CPU's share with host().
#pragma once

#include <cstdint>
#include <span>

#include "cpu/ops.h"
#include "model/kv_cache.h"
#include "model/model.h"

namespace strata {

struct AttentionParams {
  int n_head = 0, n_head_kv = 0, head_dim_k = 0, head_dim_v = 0;
  float scale = 0;
  int n_swa = 0;                 // window: the query at pos sees keys pos - n_swa < j <= pos; 0: all
  const float* sinks = nullptr;  // [n_head] per-head sink logits (null: none), see attention_gqa
};

// Optional parts of a SwiGLU FFN: biases (null: none) and the activation.
struct SwigluOptions {
  const float* gate_b = nullptr;  // [n_ff], added to gate h before the activation
  const float* up_b = nullptr;    // [n_ff]
  const float* down_b = nullptr;  // [n_embd], added before `scale`
  GluParams glu;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // The CPU matmul that computes what stays on the host (the routed experts the placement leaves
  // to the CPU); its path (exact / quantized) is the backend's.
  virtual const cpu::Matmul& host() const = 0;

  // The router of layer l on h [n_tok][n_embd] (its matmul and bias), then blocks.h
  // route_topk's rule: ids / weights [n_tok][hp.n_expert_used]. Not for hash-routed layers.
  virtual void route(const HParams& hp, const LayerWeights& l, const float* h, int64_t n_tok, int32_t* ids,
                     float* weights) const = 0;
  // The cache is going away: whatever the backend keeps of its rows can go (a device copy).
  virtual void release_cache(const KvCache&) const {}
  // y[t] = W x[t]: x [n_tok][w.n_in], y [n_tok][w.n_out] (no aliasing).
  virtual void matmul(const Weight& w, const float* x, int64_t n_tok, float* y) const = 0;
  // Several matrices of the same input (q, k and v) in one dispatch.
  virtual void matmul_batch(std::span<const cpu::Matmul::MatmulOut> outs, const float* x, int64_t n_tok) const = 0;
  // out[t] = RMSNorm(x[t]) * w for n_tok rows of n floats (may alias).
  virtual void rms_norm_rows(const float* x, const Weight& w, int64_t n_tok, int64_t n, float eps,
                             float* out) const = 0;
  // RoPE (cpu::rope) of n_tok tokens of n_head heads in place, token t at position pos0 + t.
  virtual void rope(float* x, int64_t n_tok, int n_head, int head_dim, int64_t pos0,
                    const cpu::RopeParams& p) const = 0;
  // Causal GQA attention over a span's cache (blocks.h attention_gqa: the same contract).
  virtual void attention_gqa(const AttentionParams& p, KvCache& cache, int layer, const float* q, int64_t n_tok,
                             int64_t pos0, float* out) const = 0;
  // MLA's attention core (deepseek2) over a span's latent cache, whose rows are [c (kv_lora) |
  // k_pe (rope)] by position (KvCache::k_row): q [n_tok][n_head][kv_lora + rope] (each head's
  // query with W_kb absorbed, then its roped part), out [n_tok][n_head][kv_lora] = sum over
  // j <= pos0 + t of softmax_j((q . row_j) * scale) c_j.
  virtual void attention_mla(int n_head, int kv_lora, int rope, float scale, KvCache& cache, int layer, const float* q,
                             int64_t n_tok, int64_t pos0, float* out) const = 0;
  // out[t] (+)= (down(act(gate h[t]) * up h[t]) + down_b) * (scale ? scale[t] : 1).
  virtual void swiglu_ffn(const Weight& gate, const Weight& up, const Weight& down, const float* h, int64_t n_tok,
                          const float* scale, bool accumulate, float* out, const SwigluOptions& opt = {}) const = 0;
  // y += x
  virtual void add(float* y, const float* x, int64_t n) const = 0;
};

// Every op on the CPU: the engine's kernels (blocks.h, cpu/ops.h) on compute_pool().
class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(cpu::MatmulPath path = cpu::MatmulPath::quantized) : mm_(path) {}
  const char* name() const override { return "cpu"; }
  const cpu::Matmul& host() const override { return mm_; }
  cpu::MatmulPath path() const { return mm_.path(); }

  void route(const HParams& hp, const LayerWeights& l, const float* h, int64_t n_tok, int32_t* ids,
             float* weights) const override;
  void matmul(const Weight& w, const float* x, int64_t n_tok, float* y) const override { mm_.matmul(w, x, n_tok, y); }
  void matmul_batch(std::span<const cpu::Matmul::MatmulOut> outs, const float* x, int64_t n_tok) const override {
    mm_.matmul_batch(outs, x, n_tok);
  }
  void rms_norm_rows(const float* x, const Weight& w, int64_t n_tok, int64_t n, float eps, float* out) const override;
  void rope(float* x, int64_t n_tok, int n_head, int head_dim, int64_t pos0, const cpu::RopeParams& p) const override;
  void attention_gqa(const AttentionParams& p, KvCache& cache, int layer, const float* q, int64_t n_tok, int64_t pos0,
                     float* out) const override;
  void attention_mla(int n_head, int kv_lora, int rope, float scale, KvCache& cache, int layer, const float* q,
                     int64_t n_tok, int64_t pos0, float* out) const override;
  void swiglu_ffn(const Weight& gate, const Weight& up, const Weight& down, const float* h, int64_t n_tok,
                  const float* scale, bool accumulate, float* out, const SwigluOptions& opt = {}) const override;
  void add(float* y, const float* x, int64_t n) const override;

 private:
  cpu::Matmul mm_;
};

}  // namespace strata
