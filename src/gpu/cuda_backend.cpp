#include "gpu/cuda_backend.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "cpu/repack.h"
#include "gpu/cuda_kernels.h"
#include "gpu/gpu_devices.h"
#include "model/blocks.h"

namespace strata {

namespace {

gpu::RopeArgs rope_args(const cpu::RopeParams& p) {
  gpu::RopeArgs a;
  a.neox = p.kind == cpu::RopeKind::neox;
  a.n_rot = p.n_rot;
  a.freq_base = p.freq_base;
  a.factor = p.factor;
  a.n_ctx_orig = p.n_ctx_orig;
  a.beta_fast = p.beta_fast;
  a.beta_slow = p.beta_slow;
  a.ext_factor = p.ext_factor;
  a.attn_factor = p.attn_factor;
  return a;
}

}  // namespace

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(uint64_t weight_budget, cpu::MatmulPath path) {
  const GpuDevices d = list_gpu_devices();
  if (!d.built_with_cuda) return Error{"this strata was built without the CUDA library (STRATA_CUDA=OFF or no nvcc)"};
  if (d.devices.empty() || !gpu::cuda_usable())
    return Error{"no usable CUDA device (" + (d.error.empty() ? std::string("none found") : d.error) + ")"};
  return std::unique_ptr<CudaBackend>(new CudaBackend(weight_budget, path));
}

CudaBackend::~CudaBackend() {
  for (auto& [host, dev] : weights_) gpu::device_free(dev);
  for (Buffer& b : scratch_) gpu::device_free(b.p);
}

CudaBackend::Stats CudaBackend::stats() const {
  std::lock_guard lock(mu_);
  Stats s = stats_;
  s.error = error_;
  return s;
}

bool CudaBackend::fail(const Status& s) const {
  if (s.ok()) return true;
  if (error_.empty()) {
    error_ = s.error().message;
    std::fprintf(stderr, "strata: CUDA backend: %s; every op runs on the CPU from now on\n", error_.c_str());
  }
  return false;
}

bool CudaBackend::to_device(void* dst, const void* src, size_t bytes) const {
  stats_.h2d_bytes += bytes;
  return fail(gpu::copy_to_device(dst, src, bytes));
}

bool CudaBackend::to_host(void* dst, const void* src, size_t bytes) const {
  stats_.d2h_bytes += bytes;
  return fail(gpu::copy_to_host(dst, src, bytes));
}

float* CudaBackend::scratch(int i, size_t bytes) const {
  Buffer& b = scratch_[i];
  if (!on()) return nullptr;
  if (b.bytes < bytes) {
    const size_t want = std::max(bytes, b.bytes * 2);
    gpu::device_free(b.p);
    b = {};
    auto p = gpu::device_alloc(want);
    if (!p) return nullptr;  // out of device memory: this op runs on the host, the next one tries again
    b = {*p, want};
  }
  return static_cast<float*>(b.p);
}

const uint8_t* CudaBackend::device_weight(const Weight& w) const {
  if (!on() || !w || w.n_mat != 1) return nullptr;
  const size_t bytes = w.mat_bytes();
  const std::pair key(w.data, bytes);
  if (auto it = weights_.find(key); it != weights_.end()) return static_cast<const uint8_t*>(it->second);
  const bool kernel = w.n_out == 1 ? w.type == GgmlType::f32 : gpu::cuda_has_matmul(w.type);
  if (!kernel || stats_.weight_bytes + bytes > budget_) {
    weights_[key] = nullptr;  // stays on the host
    return nullptr;
  }
  auto dev = gpu::device_alloc(bytes);
  if (!dev) {  // out of device memory: this weight stays on the host
    weights_[key] = nullptr;
    return nullptr;
  }
  bool ok = true;
  if (!w.interleaved) {
    ok = to_device(*dev, w.data, bytes);
  } else {  // the file's layout back, row by row
    std::vector<uint8_t> file(bytes), tmp(w.row_bytes);
    for (int64_t r = 0; r < w.n_out; ++r)
      std::memcpy(&file[size_t(r) * w.row_bytes], cpu::file_row(w, r, 0, tmp.data()), w.row_bytes);
    ok = to_device(*dev, file.data(), bytes);
  }
  if (!ok) {
    gpu::device_free(*dev);
    return nullptr;
  }
  weights_[key] = *dev;
  stats_.weight_bytes += bytes;
  ++stats_.weights;
  return static_cast<const uint8_t*>(*dev);
}

bool CudaBackend::device_matmul(const Weight& w, const float* dx, int64_t n_tok, float* dy) const {
  const uint8_t* dw = device_weight(w);
  return dw != nullptr && fail(gpu::cuda_matmul(w.type, dw, w.n_out, w.n_in, w.row_bytes, dx, n_tok, dy));
}

void CudaBackend::route(const HParams& hp, const LayerWeights& l, const float* h, int64_t n_tok, int32_t* ids,
                        float* weights) const {
  std::lock_guard lock(mu_);
  const int n_exp = hp.n_expert, k = hp.n_expert_used;
  gpu::RouteArgs a;
  a.n_exp = n_exp;
  a.k = k;
  a.gating = int(hp.gating);
  a.n_group = hp.n_group;
  a.n_group_used = hp.n_group_used;
  a.norm_topk = hp.norm_topk;
  a.scale = hp.expert_weights_scale;
  // only the k choices per token come back, not the n_exp logits
  const size_t h_bytes = size_t(n_tok * l.router.n_in) * sizeof(float), z_bytes = size_t(n_tok * n_exp) * sizeof(float);
  const size_t out_bytes = size_t(n_tok * k) * sizeof(float);  // ids (int32), then weights
  const uint8_t* rb = l.router_b ? device_weight(l.router_b) : nullptr;
  const uint8_t* pb = l.exp_probs_b ? device_weight(l.exp_probs_b) : nullptr;
  float* dh = scratch(0, h_bytes);
  float* dz = scratch(1, z_bytes);
  auto* dout = reinterpret_cast<uint8_t*>(scratch(2, 2 * out_bytes));
  if (gpu::cuda_route_supported(a) && (!l.router_b || rb) && (!l.exp_probs_b || pb) && dh && dz && dout &&
      to_device(dh, h, h_bytes) &&
      device_matmul(l.router, dh, n_tok, dz) &&
      fail(gpu::cuda_add_rows(dz, reinterpret_cast<const float*>(rb), n_tok, n_exp)) &&
      fail(gpu::cuda_route(a, dz, reinterpret_cast<const float*>(pb), n_tok, reinterpret_cast<int32_t*>(dout),
                           reinterpret_cast<float*>(dout + out_bytes))) &&
      to_host(ids, dout, out_bytes) && to_host(weights, dout + out_bytes, out_bytes)) {
    ++stats_.device_ops;
    return;
  }
  ++stats_.host_ops;
  std::vector<float> logits(size_t(n_tok * n_exp));
  mm_.matmul(l.router, h, n_tok, logits.data());
  add_bias(logits.data(), l.router_b, n_tok, n_exp);
  route_topk(hp, l, logits.data(), n_tok, nullptr, ids, weights);
}

void CudaBackend::matmul(const Weight& w, const float* x, int64_t n_tok, float* y) const {
  const cpu::Matmul::MatmulOut out{&w, y};
  matmul_batch(std::span(&out, 1), x, n_tok);
}

void CudaBackend::matmul_batch(std::span<const cpu::Matmul::MatmulOut> outs, const float* x, int64_t n_tok) const {
  if (outs.empty()) return;
  std::lock_guard lock(mu_);
  const int64_t n_in = outs[0].w->n_in;
  float* dx = scratch(0, size_t(n_tok * n_in) * sizeof(float));
  bool x_in = dx != nullptr && to_device(dx, x, size_t(n_tok * n_in) * sizeof(float));
  for (const cpu::Matmul::MatmulOut& o : outs) {
    const Weight& w = *o.w;
    const size_t y_bytes = size_t(n_tok * w.n_out) * sizeof(float);
    float* dy = x_in ? scratch(1, y_bytes) : nullptr;
    if (dy != nullptr && device_matmul(w, dx, n_tok, dy) && to_host(o.y, dy, y_bytes)) {
      ++stats_.device_ops;
    } else {
      ++stats_.host_ops;
      mm_.matmul(w, x, n_tok, o.y);
    }
    x_in = x_in && on();
  }
}

void CudaBackend::rms_norm_rows(const float* x, const Weight& w, int64_t n_tok, int64_t n, float eps,
                                float* out) const {
  std::lock_guard lock(mu_);
  const size_t bytes = size_t(n_tok * n) * sizeof(float);
  const uint8_t* dw = w ? device_weight(w) : nullptr;
  float* dx = (!w || dw != nullptr) ? scratch(0, bytes) : nullptr;
  std::vector<float> keep;  // in place (x == out): a failed copy back part way needs x again
  if (dx != nullptr && x == out) keep.assign(x, x + n_tok * n);
  if (dx != nullptr && to_device(dx, x, bytes) &&
      fail(gpu::cuda_rms_norm(dx, reinterpret_cast<const float*>(dw), n_tok, n, eps, dx)) && to_host(out, dx, bytes)) {
    ++stats_.device_ops;
    return;
  }
  ++stats_.host_ops;
  strata::rms_norm_rows(keep.empty() ? x : keep.data(), w, n_tok, n, eps, out);
}

void CudaBackend::rope(float* x, int64_t n_tok, int n_head, int head_dim, int64_t pos0,
                       const cpu::RopeParams& p) const {
  std::lock_guard lock(mu_);
  const size_t bytes = size_t(n_tok * n_head * head_dim) * sizeof(float);
  std::vector<float> keep(x, x + bytes / sizeof(float));  // x is in place: a failure part way needs it back
  float* dx = scratch(0, bytes);
  if (dx != nullptr && to_device(dx, x, bytes) && fail(gpu::cuda_rope(dx, n_tok, n_head, head_dim, pos0, rope_args(p))) &&
      to_host(x, dx, bytes)) {
    ++stats_.device_ops;
    return;
  }
  ++stats_.host_ops;
  std::copy(keep.begin(), keep.end(), x);
  for (int64_t t = 0; t < n_tok; ++t) cpu::rope(x + t * n_head * head_dim, n_head, head_dim, pos0 + t, p);
}

void CudaBackend::attention_gqa(const AttentionParams& p, KvCache& cache, int layer, const float* q, int64_t n_tok,
                                int64_t pos0, float* out) const {
  std::lock_guard lock(mu_);
  const bool half = cache.type == KvType::f16;
  const int64_t kv_len = pos0 + n_tok, kb = KvCache::kKeyBlock;
  const int64_t k_blocks = (kv_len + kb - 1) / kb, DK = p.head_dim_k, DV = p.head_dim_v, HKV = p.n_head_kv;
  const size_t es = half ? 2 : 4;
  const size_t k_head = size_t(k_blocks * DK * kb) * es, v_head = size_t(kv_len * DV) * es;
  const size_t q_bytes = size_t(n_tok * p.n_head * DK) * sizeof(float);
  const size_t o_bytes = size_t(n_tok * p.n_head * DV) * sizeof(float);
  const uint8_t* sinks = p.sinks != nullptr ? device_weight(Weight::f32(p.sinks, p.n_head)) : nullptr;
  auto* dq = scratch(0, q_bytes);
  auto* dout = scratch(1, o_bytes);
  auto* dk = reinterpret_cast<uint8_t*>(scratch(2, k_head * size_t(HKV)));
  auto* dv = reinterpret_cast<uint8_t*>(scratch(3, v_head * size_t(HKV)));
  bool ok = p.head_dim_v <= kMaxHeadDimV && dq != nullptr && dout != nullptr && dk != nullptr && dv != nullptr &&
            (p.sinks == nullptr || sinks != nullptr) && to_device(dq, q, q_bytes);
  for (int hk = 0; ok && hk < HKV; ++hk) {
    const void* k_src = half ? static_cast<const void*>(cache.k_block16(layer, hk, 0)) : cache.k_block(layer, hk, 0);
    const void* v_src = half ? static_cast<const void*>(cache.v_head16(layer, hk)) : cache.v_head(layer, hk);
    ok = to_device(dk + size_t(hk) * k_head, k_src, k_head) && to_device(dv + size_t(hk) * v_head, v_src, v_head);
  }
  if (ok) {
    gpu::AttentionArgs a;
    a.n_head = p.n_head;
    a.n_head_kv = p.n_head_kv;
    a.head_dim_k = p.head_dim_k;
    a.head_dim_v = p.head_dim_v;
    a.scale = p.scale;
    a.n_swa = p.n_swa;
    a.sinks = reinterpret_cast<const float*>(sinks);
    a.half = half;
    a.k_blocks = k_blocks;
    a.v_rows = kv_len;
    ok = fail(gpu::cuda_attention(a, dq, dk, dv, n_tok, pos0, dout)) && to_host(out, dout, o_bytes);
  }
  if (ok) {
    ++stats_.device_ops;
    return;
  }
  ++stats_.host_ops;
  strata::attention_gqa(p, cache, layer, q, n_tok, pos0, out);
}

void CudaBackend::attention_mla(int n_head, int kv_lora, int rope, float scale, KvCache& cache, int layer,
                                const float* q, int64_t n_tok, int64_t pos0, float* out) const {
  std::lock_guard lock(mu_);
  const int64_t W = kv_lora + rope, kv_len = pos0 + n_tok;
  const size_t q_bytes = size_t(n_tok * n_head * W) * sizeof(float), o_bytes = size_t(n_tok * n_head * kv_lora) * sizeof(float),
               rows_bytes = size_t(kv_len * W) * sizeof(float);
  float* dq = scratch(0, q_bytes);
  float* dout = scratch(1, o_bytes);
  float* drows = scratch(2, rows_bytes);
  if (kv_lora <= kMaxHeadDimV && dq != nullptr && dout != nullptr && drows != nullptr && to_device(dq, q, q_bytes) &&
      to_device(drows, cache.k_row(layer, 0), rows_bytes) &&
      fail(gpu::cuda_attention_mla(n_head, kv_lora, rope, scale, dq, drows, n_tok, pos0, dout)) &&
      to_host(out, dout, o_bytes)) {
    ++stats_.device_ops;
    return;
  }
  ++stats_.host_ops;
  strata::attention_mla(n_head, kv_lora, rope, scale, cache, layer, q, n_tok, pos0, out);
}

void CudaBackend::swiglu_ffn(const Weight& gate, const Weight& up, const Weight& down, const float* h, int64_t n_tok,
                             const float* scale, bool accumulate, float* out, const SwigluOptions& opt) const {
  std::lock_guard lock(mu_);
  const int64_t E_in = gate.n_in, F = gate.n_out, E = down.n_out;
  auto bias = [&](const float* b, int64_t n) -> const float* {
    return b == nullptr ? nullptr : reinterpret_cast<const float*>(device_weight(Weight::f32(b, n)));
  };
  const float *gb = bias(opt.gate_b, F), *ub = bias(opt.up_b, F), *db = bias(opt.down_b, E);
  const bool biases = (opt.gate_b == nullptr || gb != nullptr) && (opt.up_b == nullptr || ub != nullptr) &&
                      (opt.down_b == nullptr || db != nullptr);
  float* dh = scratch(0, size_t(n_tok * E_in) * sizeof(float));
  float* dg = scratch(1, size_t(n_tok * F) * sizeof(float));
  float* du = scratch(2, size_t(n_tok * F) * sizeof(float));
  float* dd = scratch(3, size_t(n_tok * E) * sizeof(float));
  std::vector<float> d(size_t(n_tok * E));
  const bool ok = biases && dh != nullptr && dg != nullptr && du != nullptr && dd != nullptr &&
                  to_device(dh, h, size_t(n_tok * E_in) * sizeof(float)) && device_matmul(gate, dh, n_tok, dg) &&
                  device_matmul(up, dh, n_tok, du) && fail(gpu::cuda_add_rows(dg, gb, n_tok, F)) &&
                  fail(gpu::cuda_add_rows(du, ub, n_tok, F)) &&
                  fail(gpu::cuda_glu(int(opt.glu.kind), opt.glu.alpha, opt.glu.limit, dg, du, n_tok * F)) &&
                  device_matmul(down, dg, n_tok, dd) && fail(gpu::cuda_add_rows(dd, db, n_tok, E)) &&
                  to_host(d.data(), dd, d.size() * sizeof(float));
  if (!ok) {
    ++stats_.host_ops;
    strata::swiglu_ffn(mm_, gate, up, down, h, n_tok, scale, accumulate, out, opt);
    return;
  }
  ++stats_.device_ops;
  for (int64_t t = 0; t < n_tok; ++t) {
    const float s = scale != nullptr ? scale[t] : 1.0f;
    float* o = out + t * E;
    for (int64_t i = 0; i < E; ++i) o[i] = (accumulate ? o[i] : 0.0f) + d[size_t(t * E + i)] * s;
  }
}

}  // namespace strata
