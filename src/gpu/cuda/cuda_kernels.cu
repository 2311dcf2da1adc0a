// CUDA kernels (gpu/cuda_kernels.h). Block layouts as ggml's (src/cpu/quant_blocks.h is the host
// side's description): Q8_0 {fp16 d; int8 q[32]}, Q4_K {fp16 d, dmin; uint8 scales[12];
// uint8 q[128]} per 256, MXFP4 {uint8 e8m0; uint8 q[16]} per 32.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

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

template <>
__device__ __forceinline__ float element<int(GgmlType::mxfp4)>(const uint8_t* row, int64_t i) {
  const uint8_t* b = row + (i / 32) * 17;
  const int j = int(i % 32);
  const uint8_t q = b[1 + j % 16];
  return e8m0_half(b[0]) * float(kMxfp4[j < 16 ? q & 0xF : q >> 4]);
}

// One warp per row: lane l sums elements l, l + 32, ...; then a shuffle reduction.
template <int kType>
__global__ void matvec_kernel(const uint8_t* w, size_t row_bytes, int64_t n_rows, int64_t n_cols, const float* x,
                              float* y) {
  const int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (r >= n_rows) return;
  const int lane = threadIdx.x % 32;
  const uint8_t* row = w + size_t(r) * row_bytes;
  float s = 0;
  for (int64_t i = lane; i < n_cols; i += 32) s += element<kType>(row, i) * x[i];
  for (int o = 16; o > 0; o /= 2) s += __shfl_down_sync(0xffffffffu, s, o);
  if (lane == 0) y[r] = s;
}

Status cuda_error(const char* what, cudaError_t e) {
  return Error{std::string("CUDA ") + what + ": " + cudaGetErrorString(e)};
}

}  // namespace

bool cuda_usable() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

Status cuda_matvec(GgmlType type, const uint8_t* w, int64_t n_rows, int64_t n_cols, size_t row_bytes, const float* x,
                   float* y) {
  using Kernel = void (*)(const uint8_t*, size_t, int64_t, int64_t, const float*, float*);
  Kernel k = nullptr;
  int64_t block = 1, block_bytes = 4;  // elements and bytes of one block of the type
  switch (type) {
    case GgmlType::f32: k = matvec_kernel<int(GgmlType::f32)>; break;
    case GgmlType::bf16: k = matvec_kernel<int(GgmlType::bf16)>, block_bytes = 2; break;
    case GgmlType::q8_0: k = matvec_kernel<int(GgmlType::q8_0)>, block = 32, block_bytes = 34; break;
    case GgmlType::q4_k: k = matvec_kernel<int(GgmlType::q4_k)>, block = 256, block_bytes = 144; break;
    case GgmlType::mxfp4: k = matvec_kernel<int(GgmlType::mxfp4)>, block = 32, block_bytes = 17; break;
    default: return Error{"CUDA matvec: no kernel for GGML type " + std::to_string(int(type))};
  }
  if (n_rows < 0 || n_cols < 0 || n_cols % block != 0 || int64_t(row_bytes) < n_cols / block * block_bytes)
    return Error{"CUDA matvec: " + std::to_string(n_cols) + " columns in rows of " + std::to_string(row_bytes) +
                 " bytes do not make whole blocks of the type"};
  if (n_rows == 0) return {};
  if (!cuda_usable()) return Error{"CUDA: no usable device"};
  uint8_t* dw = nullptr;
  float *dx = nullptr, *dy = nullptr;
  const size_t wb = size_t(n_rows) * row_bytes;
  cudaError_t e = cudaMalloc(&dw, wb);
  if (e == cudaSuccess) e = cudaMalloc(&dx, size_t(n_cols) * sizeof(float));
  if (e == cudaSuccess) e = cudaMalloc(&dy, size_t(n_rows) * sizeof(float));
  if (e == cudaSuccess) e = cudaMemcpy(dw, w, wb, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) e = cudaMemcpy(dx, x, size_t(n_cols) * sizeof(float), cudaMemcpyHostToDevice);
  if (e == cudaSuccess) {
    constexpr int kWarps = 4;
    const unsigned blocks = unsigned((n_rows + kWarps - 1) / kWarps);
    k<<<blocks, 32 * kWarps>>>(dw, row_bytes, n_rows, n_cols, dx, dy);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaMemcpy(y, dy, size_t(n_rows) * sizeof(float), cudaMemcpyDeviceToHost);
  cudaFree(dw);
  cudaFree(dx);
  cudaFree(dy);
  if (e != cudaSuccess) return cuda_error("matvec", e);
  return {};
}

}  // namespace strata::gpu
