#include "gpu/cuda_backend.h"

#include <algorithm>
#include <climits>
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
  for (auto& [key, m] : kv_) {
    gpu::device_free(m.k.p);
    gpu::device_free(m.v.p);
  }
  for (auto& [host, dev] : weights_) gpu::device_free(dev);
  for (Buffer& b : scratch_) gpu::device_free(b.p);
}

CudaBackend::Stats CudaBackend::stats() const {
  std::lock_guard lock(mu_);
  Stats s = stats_;
  s.error = error_.message();
  return s;
}

bool CudaBackend::fail(const Status& s) const { return error_.keep(s); }

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

gpu::RouteArgs CudaBackend::route_args(const HParams& hp) {
  gpu::RouteArgs a;
  a.n_exp = hp.n_expert;
  a.k = hp.n_expert_used;
  a.gating = int(hp.gating);
  a.n_group = hp.n_group;
  a.n_group_used = hp.n_group_used;
  a.norm_topk = hp.norm_topk;
  a.scale = hp.expert_weights_scale;
  return a;
}

void CudaBackend::route(const HParams& hp, const LayerWeights& l, const float* h, int64_t n_tok, int32_t* ids,
                        float* weights) const {
  std::lock_guard lock(mu_);
  const int n_exp = hp.n_expert, k = hp.n_expert_used;
  const gpu::RouteArgs a = route_args(hp);
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

void CudaBackend::drop_mirror(std::map<std::pair<uint64_t, int>, KvMirror>::iterator it) const {
  stats_.kv_mirror_bytes -= it->second.k.bytes + it->second.v.bytes;
  gpu::device_free(it->second.k.p);
  gpu::device_free(it->second.v.p);
  kv_.erase(it);
}

CudaBackend::KvMirror* CudaBackend::kv_mirror(KvCache& cache, int layer, int64_t pos0, int64_t end) const {
  if (!on()) return nullptr;
  const bool half = cache.type == KvType::f16;
  const size_t es = half ? 2 : 4, L = size_t(layer);
  const uint8_t* hk = half ? reinterpret_cast<const uint8_t*>(cache.k16[L].data())
                           : reinterpret_cast<const uint8_t*>(cache.k[L].data());
  const uint8_t* hv = half ? reinterpret_cast<const uint8_t*>(cache.v16[L].data())
                           : reinterpret_cast<const uint8_t*>(cache.v[L].data());
  const size_t k_bytes = (half ? cache.k16[L].size() : cache.k[L].size()) * es;
  const size_t v_bytes = (half ? cache.v16[L].size() : cache.v[L].size()) * es;
  const std::pair key(cache.uid, layer);
  auto it = kv_.find(key);
  if (it == kv_.end()) {
    // room from mirrors not used for a while (those of live caches are used every step, so the
    // layers' cycle never evicts its own); none: this call runs on the host
    const uint64_t idle = kv_clock_ > 4 * kMirrors ? kv_clock_ - 4 * kMirrors : 0;
    auto evict_idle = [&] {
      auto lru = std::min_element(kv_.begin(), kv_.end(), [](auto& a, auto& b) { return a.second.used < b.second.used; });
      if (lru == kv_.end() || lru->second.used >= idle) return false;
      drop_mirror(lru);
      return true;
    };
    while (kv_.size() >= kMirrors)
      if (!evict_idle()) return nullptr;
    KvMirror m;
    for (;;) {
      auto k = gpu::device_alloc(k_bytes);
      auto v = v_bytes > 0 ? gpu::device_alloc(v_bytes) : Result<void*>(nullptr);
      if (k.ok() && v.ok()) {
        m.k = {*k, k_bytes};
        m.v = {*v, v_bytes};
        break;
      }
      if (k.ok()) gpu::device_free(*k);
      if (v.ok()) gpu::device_free(*v);
      if (!evict_idle()) return nullptr;  // out of device memory
    }
    stats_.kv_mirror_bytes += k_bytes + v_bytes;
    it = kv_.emplace(key, m).first;
  }
  KvMirror& m = it->second;
  m.used = ++kv_clock_;
  const int64_t from = std::min(m.valid, pos0);
  m.valid = from;  // until the copies below succeed
  auto* dk = static_cast<uint8_t*>(m.k.p);
  auto* dv = static_cast<uint8_t*>(m.v.p);
  bool ok = true;
  if (cache.k_heads > 0) {  // GQA: K in key blocks by head, V by head
    const int64_t kb = KvCache::kKeyBlock, b0 = from / kb, b1 = (end + kb - 1) / kb;
    const size_t head_dim = size_t(cache.k_width / cache.k_heads), dvh = size_t(cache.v_width / cache.k_heads);
    for (int h = 0; ok && h < cache.k_heads; ++h) {
      const size_t k_off = cache.k_block_offset(h, b0) * es, k_n = size_t(b1 - b0) * head_dim * size_t(kb) * es;
      const size_t v_off = (size_t(h) * size_t(cache.n_ctx) + size_t(from)) * dvh * es,
                   v_n = size_t(end - from) * dvh * es;
      ok = to_device(dk + k_off, hk + k_off, k_n) && to_device(dv + v_off, hv + v_off, v_n);
    }
  } else {  // rows by position (MLA's latent rows)
    const size_t row = size_t(cache.k_width) * es;
    ok = to_device(dk + size_t(from) * row, hk + size_t(from) * row, size_t(end - from) * row);
  }
  if (!ok) return nullptr;
  m.valid = end;
  return &m;
}

void CudaBackend::release_cache(const KvCache& cache) const {
  std::lock_guard lock(mu_);
  for (auto it = kv_.lower_bound({cache.uid, INT_MIN}); it != kv_.end() && it->first.first == cache.uid;)
    drop_mirror(it++);
}

void CudaBackend::attention_gqa(const AttentionParams& p, KvCache& cache, int layer, const float* q, int64_t n_tok,
                                int64_t pos0, float* out) const {
  std::lock_guard lock(mu_);
  const bool half = cache.type == KvType::f16;
  const int64_t kv_len = pos0 + n_tok, kb = KvCache::kKeyBlock, DK = p.head_dim_k;
  const size_t q_bytes = size_t(n_tok * p.n_head * DK) * sizeof(float);
  const size_t o_bytes = size_t(n_tok * p.n_head * p.head_dim_v) * sizeof(float);
  const uint8_t* sinks = p.sinks != nullptr ? device_weight(Weight::f32(p.sinks, p.n_head)) : nullptr;
  auto* dq = scratch(0, q_bytes);
  auto* dout = scratch(1, o_bytes);
  // (q8_0 caches: no device kernel reads them yet; the host's attention does)
  KvMirror* m = p.head_dim_v <= kMaxHeadDimV && cache.k_heads == p.n_head_kv && cache.type != KvType::q8_0
                    ? kv_mirror(cache, layer, pos0, kv_len)
                    : nullptr;
  bool ok = m != nullptr && dq != nullptr && dout != nullptr && (p.sinks == nullptr || sinks != nullptr) &&
            to_device(dq, q, q_bytes);
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
    // the mirror has the host's layout: strides of the whole cache
    a.k_blocks = (cache.n_ctx + kb - 1) / kb;
    a.v_rows = cache.n_ctx;
    ok = fail(gpu::cuda_attention(a, dq, m->k.p, m->v.p, n_tok, pos0, dout)) && to_host(out, dout, o_bytes);
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
  const size_t q_bytes = size_t(n_tok * n_head * W) * sizeof(float), o_bytes = size_t(n_tok * n_head * kv_lora) * sizeof(float);
  float* dq = scratch(0, q_bytes);
  float* dout = scratch(1, o_bytes);
  KvMirror* m = kv_lora <= kMaxHeadDimV && cache.k_heads == 0 && cache.type == KvType::f32 && cache.k_width == W
                    ? kv_mirror(cache, layer, pos0, kv_len)
                    : nullptr;
  if (m != nullptr && dq != nullptr && dout != nullptr && to_device(dq, q, q_bytes) &&
      fail(gpu::cuda_attention_mla(n_head, kv_lora, rope, scale, dq, static_cast<const float*>(m->k.p), n_tok, pos0,
                                   dout)) &&
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
