// The CUDA backend (issue #7): Backend's ops on device 0 with the kernels of gpu/cuda_kernels.h.
// Plain C++ over that API, so every build has it; without the CUDA library or a device, create()
// says why and the engine runs everything on the CPU.
//
// Dense weights (attention, norms, routers, dense and shared FFNs, the lm head) are copied to the
// device the first time an op reads them, in the file's block layout (rows the loader interleaved
// for the CPU kernels are put back), while they fit in `weight_budget` (scratch and the KV mirrors
// come on top). A weight is known by its host address and size, so the weights must
// outlive the backend (the model's do). A weight that does not fit, or whose type has no CUDA
// kernel, is computed by the host (counted: stats()).
// Activations are host rows: each op copies its inputs in and its outputs out (model/backend.h
// says why; docs/gpu.md says what comes next). The KV cache is mirrored on the device: each
// cache's layer (KvCache::uid) has a device copy of the host layout, and attention copies in only
// the rows from the first one it writes this call (pos0; rows before it are unchanged since the
// last call, as every write of the cache precedes an attention call at its positions), plus any
// the mirror lacks. A cache's mirrors go with it (release_cache). When kMirrors are kept, or the
// device is full, only a mirror idle for several steps is evicted; else that call runs on the host. Running out of device memory sends that op (or weight) to the host; any other
// CUDA error is logged once, and from then on every op runs on the host, so the logits stay right.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <map>
#include <utility>

#include "gpu/cuda_kernels.h"
#include "model/backend.h"

namespace strata {

class CudaBackend final : public Backend {
 public:
  // Errors: a build without CUDA, no usable device.
  static Result<std::unique_ptr<CudaBackend>> create(uint64_t weight_budget,
                                                     cpu::MatmulPath path = cpu::MatmulPath::quantized);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  const char* name() const override { return "cuda"; }
  const cpu::Matmul& host() const override { return mm_; }

  void route(const HParams& hp, const LayerWeights& l, const float* h, int64_t n_tok, int32_t* ids,
             float* weights) const override;
  // The routers' rule of hp for the CUDA route kernel.
  static gpu::RouteArgs route_args(const HParams& hp);
  void release_cache(const KvCache& cache) const override;
  void matmul(const Weight& w, const float* x, int64_t n_tok, float* y) const override;
  void matmul_batch(std::span<const cpu::Matmul::MatmulOut> outs, const float* x, int64_t n_tok) const override;
  void rms_norm_rows(const float* x, const Weight& w, int64_t n_tok, int64_t n, float eps, float* out) const override;
  void rope(float* x, int64_t n_tok, int n_head, int head_dim, int64_t pos0, const cpu::RopeParams& p) const override;
  void attention_gqa(const AttentionParams& p, KvCache& cache, int layer, const float* q, int64_t n_tok, int64_t pos0,
                     float* out) const override;
  void attention_mla(int n_head, int kv_lora, int rope, float scale, KvCache& cache, int layer, const float* q,
                     int64_t n_tok, int64_t pos0, float* out) const override;
  void swiglu_ffn(const Weight& gate, const Weight& up, const Weight& down, const float* h, int64_t n_tok,
                  const float* scale, bool accumulate, float* out, const SwigluOptions& opt = {}) const override;
  void add(float* y, const float* x, int64_t n) const override { cpu::add(y, x, n); }

  struct Stats {
    uint64_t weight_bytes = 0;  // device copies of weights
    int64_t weights = 0;
    int64_t device_ops = 0, host_ops = 0;  // ops run on the device / left to the host
    uint64_t h2d_bytes = 0, d2h_bytes = 0;
    uint64_t kv_mirror_bytes = 0;  // device memory of the KV mirrors
    std::string error;  // the CUDA error that sent every op to the host (empty: none)
  };
  Stats stats() const;

 private:
  CudaBackend(uint64_t weight_budget, cpu::MatmulPath path) : mm_(path), budget_(weight_budget) {}
  // The device copy of a weight's bytes (a 2D matrix or a vector), made on first use; null when it
  // cannot be on the device (budget, type, a stack, an earlier error).
  const uint8_t* device_weight(const Weight& w) const;
  // Device scratch buffer `i`, grown to at least `bytes` (null after an error).
  float* scratch(int i, size_t bytes) const;
  // y = W x on device rows (dx, dy); false when W is not on the device or the kernel failed.
  bool device_matmul(const Weight& w, const float* dx, int64_t n_tok, float* dy) const;
  bool to_device(void* dst, const void* src, size_t bytes) const;
  bool to_host(void* dst, const void* src, size_t bytes) const;
  // Records the first error and turns the device off; false.
  bool fail(const Status& s) const;
  bool on() const { return error_.empty(); }

  cpu::Matmul mm_;
  uint64_t budget_;
  mutable std::mutex mu_;  // one op at a time: ops share the scratch buffers
  // device copies by (host address, bytes); null: stays on the host
  mutable std::map<std::pair<const uint8_t*, size_t>, void*> weights_;
  struct Buffer {
    void* p = nullptr;
    size_t bytes = 0;
  };
  static constexpr int kScratch = 4;
  // A cache layer's rows on the device, in the host's layout; rows [0, valid) are current.
  struct KvMirror {
    Buffer k, v;
    int64_t valid = 0;
    uint64_t used = 0;  // kv_clock_ at the last use
  };
  static constexpr size_t kMirrors = 512;  // layers of all caches (e.g. 8 sessions of 64 layers)
  // The mirror of (cache, layer) with rows [0, end) current: rows from min(valid, pos0) copied
  // in. Null on failure (out of device memory even after evicting the others, a copy error).
  KvMirror* kv_mirror(KvCache& cache, int layer, int64_t pos0, int64_t end) const;
  void drop_mirror(std::map<std::pair<uint64_t, int>, KvMirror>::iterator it) const;
  mutable std::map<std::pair<uint64_t, int>, KvMirror> kv_;
  mutable uint64_t kv_clock_ = 0;
  static constexpr int kMaxHeadDimV = 512;  // the attention kernel's (cuda_kernels.cu kMaxDv)
  mutable Buffer scratch_[kScratch];
  mutable Stats stats_;
  mutable StickyError error_{"CUDA backend", "every op runs on the CPU from now on"};
};

}  // namespace strata
