// CUDA kernels (gpu/cuda_kernels.h). Block layouts as ggml's (src/cpu/quant_blocks.h is the host
// side's description): Q8_0 {fp16 d; int8 q[32]}, Q4_K {fp16 d, dmin; uint8 scales[12];
// uint8 q[128]} per 256, Q6_K (below), MXFP4 {uint8 e8m0; uint8 q[16]} per 32.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <mutex>
#include <string>

#include "gpu/cuda_kernels.h"

namespace strata::gpu {

namespace {

__device__ __forceinline__ float half_at(const uint8_t* p) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(p[0] | (p[1] << 8))));
}

// Q4_K's 6-bit scale and min of sub-block j (0..7), as ggml's get_scale_min_k4.
__device__ __forceinline__ void scale_min_k4(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

__device__ __forceinline__ float e8m0_half(uint8_t e) {
  const unsigned bits = e < 2 ? (0x00200000u << e) : (unsigned(e - 1) << 23);
  return __uint_as_float(bits);
}

__constant__ int8_t kMxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// Element i of a row in the file's layout.
template <int kType>
__device__ __forceinline__ float element(const uint8_t* row, int64_t i);

template <>
__device__ __forceinline__ float element<int(GgmlType::f32)>(const uint8_t* row, int64_t i) {
  return reinterpret_cast<const float*>(row)[i];
}

template <>
__device__ __forceinline__ float element<int(GgmlType::bf16)>(const uint8_t* row, int64_t i) {
  const uint8_t* p = row + 2 * i;
  return __uint_as_float(unsigned(p[0] | (p[1] << 8)) << 16);
}

template <>
__device__ __forceinline__ float element<int(GgmlType::q8_0)>(const uint8_t* row, int64_t i) {
  const uint8_t* b = row + (i / 32) * 34;
  return half_at(b) * float(static_cast<int8_t>(b[2 + i % 32]));
}

template <>
__device__ __forceinline__ float element<int(GgmlType::q4_k)>(const uint8_t* row, int64_t i) {
  const uint8_t* b = row + (i / 256) * 144;
  const int j = int(i % 256), chunk = j / 64, within = j % 64, high = within >= 32, l = within % 32;
  int sc = 0, m = 0;
  scale_min_k4(2 * chunk + high, b + 4, &sc, &m);
  const uint8_t q = b[16 + chunk * 32 + l];
  const int nib = high ? q >> 4 : q & 0xF;
  return half_at(b) * float(sc) * float(nib) - half_at(b + 2) * float(m);
}

// Q6_K {uint8 ql[128]; uint8 qh[64]; int8 scales[16]; fp16 d} per 256, as ggml's
// dequantize_row_q6_K: two halves of 128, each four quarters of 32.
template <>
__device__ __forceinline__ float element<int(GgmlType::q6_k)>(const uint8_t* row, int64_t i) {
  const uint8_t* b = row + (i / 256) * 210;
  const int j = int(i % 256), n = j / 128, quarter = (j % 128) / 32, l = j % 32;
  const uint8_t* ql = b + n * 64;
  const uint8_t qh = b[128 + n * 32 + l];
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + n * 8 + l / 16;
  const int low = quarter & 1 ? ql[l + 32] : ql[l];
  const int q = ((quarter < 2 ? low & 0xF : low >> 4) | (((qh >> (2 * quarter)) & 3) << 4)) - 32;
  return half_at(b + 208) * float(sc[2 * quarter]) * float(q);
}

template <>
__device__ __forceinline__ float element<int(GgmlType::mxfp4)>(const uint8_t* row, int64_t i) {
  const uint8_t* b = row + (i / 32) * 17;
  const int j = int(i % 32);
  const uint8_t q = b[1 + j % 16];
  return e8m0_half(b[0]) * float(kMxfp4[j < 16 ? q & 0xF : q >> 4]);
}

// Matmul: one warp per weight row and up to kTok tokens; lane l takes elements l, l + 32, ... of
// the row (each dequantized once for the kTok tokens), then a shuffle reduction per token.
constexpr int kTok = 8;

template <int kType>
__global__ void matmul_kernel(const uint8_t* w, size_t row_bytes, int64_t n_rows, int64_t n_cols, const float* x,
                              int64_t n_tok, float* y) {
  const int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (r >= n_rows) return;
  const int64_t t0 = int64_t(blockIdx.y) * kTok;
  const int nt = n_tok - t0 < kTok ? int(n_tok - t0) : kTok;
  const int lane = threadIdx.x % 32;
  const uint8_t* row = w + size_t(r) * row_bytes;
  float s[kTok] = {};
  for (int64_t i = lane; i < n_cols; i += 32) {
    const float e = element<kType>(row, i);
#pragma unroll
    for (int t = 0; t < kTok; ++t)
      if (t < nt) s[t] += e * x[(t0 + t) * n_cols + i];
  }
#pragma unroll
  for (int t = 0; t < kTok; ++t) {
    float v = s[t];
    for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);
    if (lane == 0 && t < nt) y[(t0 + t) * n_rows + r] = v;
  }
}

// The whole matrix as floats, for cuBLAS: one thread per element.
template <int kType>
__global__ void dequantize_kernel(const uint8_t* w, size_t row_bytes, int64_t n_rows, int64_t n_cols, float* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_rows * n_cols) return;
  out[i] = element<kType>(w + size_t(i / n_cols) * row_bytes, i % n_cols);
}

// One block of 256 threads per row: the sum of squares in double (as the CPU's rms_norm).
__global__ void rms_norm_kernel(const float* x, const float* w, int64_t n, float eps, float* out) {
  const float* xr = x + int64_t(blockIdx.x) * n;
  float* orow = out + int64_t(blockIdx.x) * n;
  double ss = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += double(xr[i]) * double(xr[i]);
  __shared__ double part[256];
  part[threadIdx.x] = ss;
  __syncthreads();
  for (int o = blockDim.x / 2; o > 0; o /= 2) {
    if (int(threadIdx.x) < o) part[threadIdx.x] += part[threadIdx.x + o];
    __syncthreads();
  }
  const float scale = 1.0f / sqrtf(float(part[0] / double(n)) + eps);
  // every thread has read part[0] before any writes out (out may alias x; each element is read
  // and written by the same thread)
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) orow[i] = xr[i] * scale * (w ? w[i] : 1.0f);
}

__device__ float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
  return n_dims * logf(n_ctx_orig / (n_rot * 2 * 3.14159265358979f)) / (2 * logf(base));
}

// One thread per (token, head, pair); ggml's rope_yarn as cpu::rope.
__global__ void rope_kernel(float* x, int64_t n_tok, int n_head, int head_dim, int64_t pos0, RopeArgs p) {
  const int half = p.n_rot / 2;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n_tok * n_head * half) return;
  const int i = int(idx % half);
  const int64_t th = idx / half;  // token * n_head + head
  const int64_t t = th / n_head;
  const float theta_scale = powf(p.freq_base, -2.0f / float(p.n_rot));
  const bool yarn = p.ext_factor != 0.0f;
  const float freq_scale = 1.0f / p.factor;
  const float theta_extrap = float(pos0 + t) * powf(theta_scale, float(i));
  const float theta_interp = freq_scale * theta_extrap;
  float theta = theta_interp, mscale = p.attn_factor;
  if (yarn) {
    const float corr_low = fmaxf(0.0f, floorf(yarn_corr_dim(p.n_rot, p.n_ctx_orig, p.beta_fast, p.freq_base)));
    const float corr_high =
        fminf(float(p.n_rot - 1), ceilf(yarn_corr_dim(p.n_rot, p.n_ctx_orig, p.beta_slow, p.freq_base)));
    const float y = (float(i) - corr_low) / fmaxf(0.001f, corr_high - corr_low);
    const float ramp_mix = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * p.ext_factor;
    theta = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix;
    mscale *= 1.0f + 0.1f * logf(1.0f / freq_scale);
  }
  const float c = cosf(theta) * mscale, s = sinf(theta) * mscale;
  float* v = x + th * head_dim;
  const int a = p.neox ? i : 2 * i, b = p.neox ? i + half : 2 * i + 1;
  const float x0 = v[a], x1 = v[b];
  v[a] = x0 * c - x1 * s;
  v[b] = x0 * s + x1 * c;
}

template <bool kHalf>
__device__ __forceinline__ float kv_at(const void* p, int64_t i) {
  if constexpr (kHalf) return __half2float(static_cast<const __half*>(p)[i]);
  else return static_cast<const float*>(p)[i];
}

constexpr int kMaxDv = 512;  // head_dim_v up to 16 values per lane

// One warp per (token, head): keys one at a time (the q.k dot split over the lanes, then reduced),
// an online softmax, and each lane accumulating head_dim_v / 32 of the output values.
template <bool kHalf>
__global__ void attention_kernel(AttentionArgs a, const float* q, const void* k, const void* v, int64_t n_tok,
                                 int64_t pos0, float* out) {
  const int64_t wid = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (wid >= n_tok * a.n_head) return;
  const int lane = threadIdx.x % 32;
  const int64_t t = wid / a.n_head;
  const int h = int(wid % a.n_head), hk = h / (a.n_head / a.n_head_kv);
  const int DK = a.head_dim_k, DV = a.head_dim_v, kb = 32;
  const float* qr = q + wid * DK;
  const int64_t pos = pos0 + t;
  const int64_t first = a.n_swa > 0 && pos - a.n_swa + 1 > 0 ? pos - a.n_swa + 1 : 0;
  const size_t k_head = size_t(hk) * size_t(a.k_blocks) * size_t(DK) * kb;
  const size_t v_head = size_t(hk) * size_t(a.v_rows) * size_t(DV);
  float m = -INFINITY, l = 0, acc[kMaxDv / 32] = {};
  for (int64_t j = first; j <= pos; ++j) {
    float d = 0;
    const size_t kblk = k_head + size_t(j / kb) * size_t(DK) * kb + size_t(j % kb);
    for (int i = lane; i < DK; i += 32) d += qr[i] * kv_at<kHalf>(k, kblk + size_t(i) * kb);
    for (int o = 16; o > 0; o /= 2) d += __shfl_xor_sync(0xffffffffu, d, o);
    const float sc = d * a.scale;
    const float m_new = fmaxf(m, sc);
    const float corr = expf(m - m_new), p = expf(sc - m_new);
    l = l * corr + p;
    const size_t vrow = v_head + size_t(j) * size_t(DV);
#pragma unroll
    for (int c = 0; c < kMaxDv / 32; ++c) {
      const int i = lane + 32 * c;
      if (i < DV) acc[c] = acc[c] * corr + p * kv_at<kHalf>(v, vrow + size_t(i));
    }
    m = m_new;
  }
  if (a.sinks != nullptr) {  // a virtual key of logit sinks[h] and no value
    const float m_new = fmaxf(m, a.sinks[h]);
    const float corr = expf(m - m_new);
    l = l * corr + expf(a.sinks[h] - m_new);
#pragma unroll
    for (int c = 0; c < kMaxDv / 32; ++c) acc[c] *= corr;
  }
  float* o = out + wid * DV;
#pragma unroll
  for (int c = 0; c < kMaxDv / 32; ++c) {
    const int i = lane + 32 * c;
    if (i < DV) o[i] = acc[c] / l;
  }
}

// MLA: one warp per (token, head) over the latent rows [c (R) | k_pe (rope)]: the score is the
// whole row against q, the value is c; R / 32 output values per lane.
__global__ void attention_mla_kernel(int n_head, int R, int W, float scale, const float* q, const float* rows,
                                     int64_t n_tok, int64_t pos0, float* out) {
  const int64_t wid = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (wid >= n_tok * n_head) return;
  const int lane = threadIdx.x % 32;
  const int64_t pos = pos0 + wid / n_head;
  const float* qr = q + wid * W;
  float m = -INFINITY, l = 0, acc[kMaxDv / 32] = {};
  for (int64_t j = 0; j <= pos; ++j) {
    const float* row = rows + j * W;
    float d = 0;
    for (int i = lane; i < W; i += 32) d += qr[i] * row[i];
    for (int o = 16; o > 0; o /= 2) d += __shfl_xor_sync(0xffffffffu, d, o);
    const float sc = d * scale;
    const float m_new = fmaxf(m, sc);
    const float corr = expf(m - m_new), p = expf(sc - m_new);
    l = l * corr + p;
#pragma unroll
    for (int c = 0; c < kMaxDv / 32; ++c) {
      const int i = lane + 32 * c;
      if (i < R) acc[c] = acc[c] * corr + p * row[i];
    }
    m = m_new;
  }
  float* o = out + wid * R;
#pragma unroll
  for (int c = 0; c < kMaxDv / 32; ++c) {
    const int i = lane + 32 * c;
    if (i < R) o[i] = acc[c] / l;
  }
}

__global__ void glu_kernel(int kind, float alpha, float limit, float* g, const float* u, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (kind == 0) {
    const float x = g[i];
    g[i] = x / (1.0f + expf(-x)) * u[i];
  } else {
    const float x = fminf(g[i], limit), y = fminf(fmaxf(u[i], -limit), limit);
    g[i] = kind == 1 ? x / (1.0f + expf(-alpha * x)) * (y + 1.0f) : x / (1.0f + expf(-x)) * y;
  }
}

__global__ void add_rows_kernel(float* x, const float* b, int64_t n_rows, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n_rows * n) x[i] += b[i % n];
}

__global__ void gather_rows_kernel(const float* src, const int32_t* rows, int64_t n, int64_t width, float* dst) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n * width) dst[i] = src[int64_t(rows[i / width]) * width + i % width];
}

__global__ void scatter_add_rows_kernel(float* dst, const int32_t* rows, const float* scale, int64_t n, int64_t width,
                                        const float* src) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n * width) dst[int64_t(rows[i / width]) * width + i % width] += scale[i / width] * src[i];
}

constexpr int kMaxRouteExperts = 1024, kMaxRouteK = 32;

// One warp per token: prob (the weights' scores) and sel (the choosing scores) in shared memory.
__global__ void route_kernel(RouteArgs a, float* logits, const float* bias, int64_t n_tok, int32_t* ids,
                             float* weights) {
  __shared__ float prob[kMaxRouteExperts], sel[kMaxRouteExperts];
  __shared__ unsigned char taken[kMaxRouteExperts];
  __shared__ int chosen[kMaxRouteK];
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x, n = a.n_exp;
  const float* z = logits + t * n;
  float mx = -INFINITY;
  for (int e = lane; e < n; e += 32) mx = fmaxf(mx, z[e]);
  for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float sum = 0;
  for (int e = lane; e < n; e += 32) {
    float p = z[e];
    switch (a.gating) {
      case 0: p = expf(z[e] - mx); sum += p; break;
      case 1: p = 1.0f / (1.0f + expf(-z[e])); break;
      case 3: p = sqrtf(z[e] > 20.0f ? z[e] : log1pf(expf(z[e]))); break;
      default: break;
    }
    prob[e] = p;
    taken[e] = 0;
  }
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const float inv = 1.0f / sum;  // as cpu::softmax
  for (int e = lane; e < n; e += 32) {
    if (a.gating == 0) prob[e] *= inv;
    sel[e] = prob[e] + (bias != nullptr ? bias[e] : 0.0f);
  }
  __syncwarp();
  if (lane == 0 && a.n_group > 1 && a.n_group_used < a.n_group) {
    // the groups' top-2 sums; keep the n_group_used best (ties to the lower group)
    const int per = n / a.n_group;
    float score[64];
    for (int g = 0; g < a.n_group; ++g) {
      float b0 = -INFINITY, b1 = -INFINITY;
      for (int e = g * per; e < (g + 1) * per; ++e) {
        const float v = sel[e];
        if (v > b0) {
          b1 = b0;
          b0 = v;
        } else if (v > b1) {
          b1 = v;
        }
      }
      score[g] = b0 + (per > 1 ? b1 : 0.0f);
    }
    unsigned long long keep = 0;
    for (int i = 0; i < a.n_group_used; ++i) {
      int best = -1;
      for (int g = 0; g < a.n_group; ++g)
        if (!(keep >> g & 1ull) && (best < 0 || score[g] > score[best])) best = g;
      keep |= 1ull << best;
    }
    for (int g = 0; g < a.n_group; ++g)
      if (!(keep >> g & 1ull))
        for (int e = g * per; e < (g + 1) * per; ++e) sel[e] = -INFINITY;
  }
  __syncwarp();
  // the k best, one per round: each lane's best, then the warp's (ties to the lower id)
  for (int j = 0; j < a.k; ++j) {
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int e = lane; e < n; e += 32)
      if (!taken[e] && (sel[e] > bv || (sel[e] == bv && e < bi))) {
        bv = sel[e];
        bi = e;
      }
    for (int o = 16; o > 0; o /= 2) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) {
        bv = ov;
        bi = oi;
      }
    }
    if (bi == 0x7fffffff) {  // only NaN scores left: the lowest untaken id
      bi = n;
      for (int e = lane; e < n; e += 32)
        if (!taken[e]) bi = min(bi, e);
      for (int o = 16; o > 0; o /= 2) bi = min(bi, __shfl_xor_sync(0xffffffffu, bi, o));
    }
    if (lane == 0) {
      chosen[j] = bi;
      taken[bi] = 1;
    }
    __syncwarp();
  }
  if (lane != 0) return;
  float w[kMaxRouteK], total = 0;
  float wmax = -INFINITY;
  for (int j = 0; j < a.k; ++j) {
    w[j] = prob[chosen[j]];
    wmax = fmaxf(wmax, w[j]);
  }
  if (a.gating == 2) {  // a softmax over the chosen
    float s = 0;
    for (int j = 0; j < a.k; ++j) s += (w[j] = expf(w[j] - wmax));
    const float inv_s = 1.0f / s;
    for (int j = 0; j < a.k; ++j) w[j] *= inv_s;
  }
  for (int j = 0; j < a.k; ++j) total += w[j];
  for (int j = 0; j < a.k; ++j) {
    ids[t * a.k + j] = chosen[j];
    weights[t * a.k + j] = (a.norm_topk ? w[j] / total : w[j]) * a.scale;
  }
}

Status cuda_error(const char* what, cudaError_t e) {
  return Error{std::string("CUDA ") + what + ": " + cudaGetErrorString(e)};
}

Status launched(const char* what) {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? Status{} : cuda_error(what, e);
}

unsigned blocks_for(int64_t n, int per_block) { return unsigned((n + per_block - 1) / per_block); }

using MatmulKernel = void (*)(const uint8_t*, size_t, int64_t, int64_t, const float*, int64_t, float*);

// The kernel of a type, with its elements and bytes per block (null: none).
MatmulKernel matmul_kernel_for(GgmlType type, int64_t* block, int64_t* block_bytes) {
  switch (type) {
    case GgmlType::f32: *block = 1, *block_bytes = 4; return matmul_kernel<int(GgmlType::f32)>;
    case GgmlType::bf16: *block = 1, *block_bytes = 2; return matmul_kernel<int(GgmlType::bf16)>;
    case GgmlType::q8_0: *block = 32, *block_bytes = 34; return matmul_kernel<int(GgmlType::q8_0)>;
    case GgmlType::q4_k: *block = 256, *block_bytes = 144; return matmul_kernel<int(GgmlType::q4_k)>;
    case GgmlType::q6_k: *block = 256, *block_bytes = 210; return matmul_kernel<int(GgmlType::q6_k)>;
    case GgmlType::mxfp4: *block = 32, *block_bytes = 17; return matmul_kernel<int(GgmlType::mxfp4)>;
    default: return nullptr;
  }
}

}  // namespace

bool cuda_usable() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

Result<void*> device_alloc(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();  // out of memory is this call's answer, not the next launch's error
    return cuda_error(("allocating " + std::to_string(bytes) + " bytes").c_str(), e).error();
  }
  return p;
}

void device_free(void* p) {
  if (p != nullptr) cudaFree(p);
}

Status copy_to_device(void* dst, const void* src, size_t bytes) {
  const cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
  return e == cudaSuccess ? Status{} : cuda_error("copy to device", e);
}

Status copy_to_host(void* dst, const void* src, size_t bytes) {
  const cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
  return e == cudaSuccess ? Status{} : cuda_error("copy to host", e);
}

Status device_memory(size_t* free_bytes, size_t* total_bytes) {
  const cudaError_t e = cudaMemGetInfo(free_bytes, total_bytes);
  return e == cudaSuccess ? Status{} : cuda_error("memory info", e);
}

Result<void*> stream_create() {
  cudaStream_t s = nullptr;
  const cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e != cudaSuccess) return cuda_error("creating a stream", e).error();
  return static_cast<void*>(s);
}

void stream_destroy(void* stream) {
  if (stream != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

Result<void*> event_create() {
  cudaEvent_t ev = nullptr;
  const cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e != cudaSuccess) return cuda_error("creating an event", e).error();
  return static_cast<void*>(ev);
}

void event_destroy(void* event) {
  if (event != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

Status event_record(void* event, void* stream) {
  const cudaError_t e = cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream));
  return e == cudaSuccess ? Status{} : cuda_error("recording an event", e);
}

Status stream_wait_event(void* stream, void* event) {
  const cudaError_t e = cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0);
  return e == cudaSuccess ? Status{} : cuda_error("waiting for an event", e);
}

Result<bool> event_done(void* event) {
  const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (e == cudaSuccess) return true;
  if (e == cudaErrorNotReady) return false;
  return cuda_error("querying an event", e).error();
}

Status event_synchronize(void* event) {
  const cudaError_t e = cudaEventSynchronize(static_cast<cudaEvent_t>(event));
  return e == cudaSuccess ? Status{} : cuda_error("waiting for an event on the host", e);
}

Result<void*> pinned_alloc(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMallocHost(&p, bytes == 0 ? 1 : bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return cuda_error(("pinning " + std::to_string(bytes) + " bytes").c_str(), e).error();
  }
  return p;
}

void pinned_free(void* p) {
  if (p != nullptr) cudaFreeHost(p);
}

Status copy_to_device_async(void* dst, const void* src, size_t bytes, void* stream) {
  const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream));
  return e == cudaSuccess ? Status{} : cuda_error("asynchronous copy to device", e);
}

Status copy_to_host_async(void* dst, const void* src, size_t bytes, void* stream) {
  const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream));
  return e == cudaSuccess ? Status{} : cuda_error("asynchronous copy to host", e);
}

Status memset_async(void* dst, int value, size_t bytes, void* stream) {
  const cudaError_t e = cudaMemsetAsync(dst, value, bytes, static_cast<cudaStream_t>(stream));
  return e == cudaSuccess ? Status{} : cuda_error("memset", e);
}

Status cuda_gather_rows(const float* src, const int32_t* rows, int64_t n, int64_t width, float* dst) {
  if (n * width == 0) return {};
  gather_rows_kernel<<<blocks_for(n * width, 256), 256>>>(src, rows, n, width, dst);
  return launched("gather_rows");
}

Status cuda_scatter_add_rows(float* dst, const int32_t* rows, const float* scale, int64_t n, int64_t width,
                             const float* src) {
  if (n * width == 0) return {};
  scatter_add_rows_kernel<<<blocks_for(n * width, 256), 256>>>(dst, rows, scale, n, width, src);
  return launched("scatter_add_rows");
}

namespace {

// ---- cuBLAS for large batches ----
// Loaded at run time (dlopen of libcublas.so), so a strata built with CUDA still starts where the
// toolkit's libraries are missing: the matmul then stays on its own kernel. From kCublasTokens
// tokens, cuda_matmul dequantizes the weight to floats once and runs cuBLAS's SGEMM (full FP32),
// instead of dequantizing every element once per 8 tokens. The threshold is a guess: no session
// has had a GPU to measure the break-even.
constexpr int64_t kCublasTokens = 64;
// The dequantized copy is kept for the next call, up to this size (larger weights, such as a big
// vocabulary's head, stay on the kernel, whose memory is only the weight's own).
constexpr size_t kCublasScratchFloats = size_t(64) << 20;  // 256 MiB

struct Cublas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasSgemm_v2) sgemm = nullptr;
  cublasHandle_t handle = nullptr;
  float* scratch = nullptr;  // the dequantized weight
  size_t scratch_floats = 0;
  std::string name;  // the library loaded ("" : none)
  std::mutex mu;
};

Cublas& cublas() {
  static Cublas* c = [] {
    auto* b = new Cublas;
    const std::string names[] = {"libcublas.so." + std::to_string(CUBLAS_VER_MAJOR), "libcublas.so"};
    for (const std::string& n : names) {
      void* lib = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib == nullptr) continue;
      b->create = reinterpret_cast<decltype(&cublasCreate_v2)>(dlsym(lib, "cublasCreate_v2"));
      b->sgemm = reinterpret_cast<decltype(&cublasSgemm_v2)>(dlsym(lib, "cublasSgemm_v2"));
      if (b->create != nullptr && b->sgemm != nullptr && b->create(&b->handle) == CUBLAS_STATUS_SUCCESS) {
        b->name = n;
        break;
      }
      b->handle = nullptr;
      dlclose(lib);
    }
    return b;
  }();
  return *c;
}

using DequantizeKernel = void (*)(const uint8_t*, size_t, int64_t, int64_t, float*);
DequantizeKernel dequantize_kernel_for(GgmlType type) {
  switch (type) {
    case GgmlType::f32: return dequantize_kernel<int(GgmlType::f32)>;
    case GgmlType::bf16: return dequantize_kernel<int(GgmlType::bf16)>;
    case GgmlType::q8_0: return dequantize_kernel<int(GgmlType::q8_0)>;
    case GgmlType::q4_k: return dequantize_kernel<int(GgmlType::q4_k)>;
    case GgmlType::q6_k: return dequantize_kernel<int(GgmlType::q6_k)>;
    case GgmlType::mxfp4: return dequantize_kernel<int(GgmlType::mxfp4)>;
    default: return nullptr;
  }
}

// y = W x through cuBLAS; false when it is not loaded or fails (the caller runs its own kernel).
bool cublas_matmul(GgmlType type, const uint8_t* w, int64_t n_rows, int64_t n_cols, size_t row_bytes, const float* x,
                   int64_t n_tok, float* y) {
  Cublas& c = cublas();
  const DequantizeKernel dq = dequantize_kernel_for(type);
  const size_t n = size_t(n_rows * n_cols);
  if (c.handle == nullptr || dq == nullptr || n > kCublasScratchFloats || n_cols > INT32_MAX || n_tok > INT32_MAX)
    return false;
  std::lock_guard lock(c.mu);  // one scratch
  if (c.scratch_floats < n) {
    cudaFree(c.scratch);  // waits for the kernels that read it
    c.scratch = nullptr;
    c.scratch_floats = 0;
    if (cudaMalloc(&c.scratch, n * sizeof(float)) != cudaSuccess) {
      cudaGetLastError();  // out of memory here is not an error of the device: the kernel runs instead
      return false;
    }
    c.scratch_floats = n;
  }
  dq<<<unsigned((n + 255) / 256), 256>>>(w, row_bytes, n_rows, n_cols, c.scratch);
  if (cudaPeekAtLastError() != cudaSuccess) return false;  // reported by the caller's next launch check
  // row-major W [n_rows][n_cols], x [n_tok][n_cols], y [n_tok][n_rows] are, column-major,
  // W^T (n_cols x n_rows), x^T and y^T: y^T = (W^T)^T x^T
  const float one = 1.0f, zero = 0.0f;
  return c.sgemm(c.handle, CUBLAS_OP_T, CUBLAS_OP_N, int(n_rows), int(n_tok), int(n_cols), &one, c.scratch,
                 int(n_cols), x, int(n_cols), &zero, y, int(n_rows)) == CUBLAS_STATUS_SUCCESS;
}

}  // namespace

std::string cuda_gemm_library() {
  const Cublas& c = cublas();
  return c.handle != nullptr ? "cuBLAS (" + c.name + ") from " + std::to_string(kCublasTokens) + " tokens"
                             : "none (libcublas not found: every matmul on strata's kernel)";
}

bool cuda_has_matmul(GgmlType type) {
  int64_t block = 0, bytes = 0;
  return matmul_kernel_for(type, &block, &bytes) != nullptr;
}

Status cuda_matmul(GgmlType type, const uint8_t* w, int64_t n_rows, int64_t n_cols, size_t row_bytes, const float* x,
                   int64_t n_tok, float* y) {
  int64_t block = 1, block_bytes = 4;
  const MatmulKernel k = matmul_kernel_for(type, &block, &block_bytes);
  if (k == nullptr) return Error{"CUDA matmul: no kernel for GGML type " + std::to_string(int(type))};
  if (n_rows < 0 || n_cols < 0 || n_tok < 0 || n_cols % block != 0 ||
      int64_t(row_bytes) < n_cols / block * block_bytes)
    return Error{"CUDA matmul: " + std::to_string(n_cols) + " columns in rows of " + std::to_string(row_bytes) +
                 " bytes do not make whole blocks of the type"};
  if (n_rows == 0 || n_tok == 0) return {};
  if (n_tok >= kCublasTokens && cublas_matmul(type, w, n_rows, n_cols, row_bytes, x, n_tok, y)) return {};
  constexpr int kWarps = 4;
  const dim3 grid(blocks_for(n_rows, kWarps), unsigned((n_tok + kTok - 1) / kTok));
  k<<<grid, 32 * kWarps>>>(w, row_bytes, n_rows, n_cols, x, n_tok, y);
  return launched("matmul");
}

Status cuda_rms_norm(const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* out) {
  if (n_rows <= 0) return {};
  rms_norm_kernel<<<unsigned(n_rows), 256>>>(x, w, n, eps, out);
  return launched("rms_norm");
}

Status cuda_rope(float* x, int64_t n_tok, int n_head, int head_dim, int64_t pos0, const RopeArgs& p) {
  if (p.n_rot <= 0 || p.n_rot > head_dim || p.n_rot % 2 != 0)
    return Error{"CUDA rope: n_rot " + std::to_string(p.n_rot) + " for heads of " + std::to_string(head_dim)};
  const int64_t n = n_tok * n_head * (p.n_rot / 2);
  if (n == 0) return {};
  rope_kernel<<<blocks_for(n, 256), 256>>>(x, n_tok, n_head, head_dim, pos0, p);
  return launched("rope");
}

Status cuda_attention(const AttentionArgs& a, const float* q, const void* k, const void* v, int64_t n_tok,
                      int64_t pos0, float* out) {
  if (a.head_dim_v > kMaxDv || a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0)
    return Error{"CUDA attention: heads " + std::to_string(a.n_head) + "/" + std::to_string(a.n_head_kv) +
                 " of value width " + std::to_string(a.head_dim_v) + " (the kernel takes up to " +
                 std::to_string(kMaxDv) + ")"};
  const int64_t warps = n_tok * a.n_head;
  if (warps == 0) return {};
  constexpr int kWarps = 4;
  if (a.half) attention_kernel<true><<<blocks_for(warps, kWarps), 32 * kWarps>>>(a, q, k, v, n_tok, pos0, out);
  else attention_kernel<false><<<blocks_for(warps, kWarps), 32 * kWarps>>>(a, q, k, v, n_tok, pos0, out);
  return launched("attention");
}

Status cuda_attention_mla(int n_head, int kv_lora, int rope, float scale, const float* q, const float* rows,
                          int64_t n_tok, int64_t pos0, float* out) {
  if (kv_lora > kMaxDv || n_head <= 0)
    return Error{"CUDA MLA attention: " + std::to_string(n_head) + " heads of latent width " + std::to_string(kv_lora) +
                 " (the kernel takes up to " + std::to_string(kMaxDv) + ")"};
  const int64_t warps = n_tok * n_head;
  if (warps == 0) return {};
  constexpr int kWarps = 4;
  attention_mla_kernel<<<blocks_for(warps, kWarps), 32 * kWarps>>>(n_head, kv_lora, kv_lora + rope, scale, q, rows,
                                                                   n_tok, pos0, out);
  return launched("attention_mla");
}

bool cuda_route_supported(const RouteArgs& a) {
  return a.n_exp > 0 && a.n_exp <= kMaxRouteExperts && a.k > 0 && a.k <= kMaxRouteK && a.k <= a.n_exp &&
         a.gating >= 0 && a.gating <= 3 &&
         (a.n_group <= 1 || (a.n_group <= 64 && a.n_exp % a.n_group == 0 && a.n_group_used >= 1));
}

Status cuda_route(const RouteArgs& a, float* logits, const float* probs_bias, int64_t n_tok, int32_t* ids,
                  float* weights) {
  if (!cuda_route_supported(a))
    return Error{"CUDA route: " + std::to_string(a.n_exp) + " experts, top-" + std::to_string(a.k) + " in " +
                 std::to_string(a.n_group) + " groups (the kernel takes up to " + std::to_string(kMaxRouteExperts) +
                 " experts, top-" + std::to_string(kMaxRouteK) + ", 64 groups)"};
  if (n_tok == 0) return {};
  route_kernel<<<unsigned(n_tok), 32>>>(a, logits, probs_bias, n_tok, ids, weights);
  return launched("route");
}

Status cuda_glu(int kind, float alpha, float limit, float* g, const float* u, int64_t n) {
  if (kind < 0 || kind > 2) return Error{"CUDA glu: unknown activation " + std::to_string(kind)};
  if (n == 0) return {};
  glu_kernel<<<blocks_for(n, 256), 256>>>(kind, alpha, limit, g, u, n);
  return launched("glu");
}

Status cuda_add_rows(float* x, const float* b, int64_t n_rows, int64_t n) {
  if (b == nullptr || n_rows * n == 0) return {};
  add_rows_kernel<<<blocks_for(n_rows * n, 256), 256>>>(x, b, n_rows, n);
  return launched("add_rows");
}

}  // namespace strata::gpu
