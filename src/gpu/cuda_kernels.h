// The CUDA kernels of the backend (issue #7) and the device memory they work on. No CUDA type
// appears here: pointers are device addresses as void* / float*; builds without the CUDA library
// (cuda_kernels_none.cpp) get errors that say so.
//
// Every kernel is reference-grade (correct first; fast kernels are the next step of #7): one warp
// per output row of a matmul (from 64 tokens, the weight dequantized to floats and cuBLAS's SGEMM
// when libcublas can be loaded), weights dequantized in the kernel from the file's block layout
// (F32, BF16, Q8_0, Q4_K, Q6_K, MXFP4), float accumulation; one warp per (token, head) of attention with
// an online softmax (GQA and MLA). Kernels run in order on one stream; copy_to_host waits for them. A launch
// error is returned by the call that launched it, an execution error by the next synchronous copy,
// event_synchronize or event_done.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/error.h"
#include "cpu/ggml_type.h"

namespace strata::gpu {

// Whether a CUDA device and driver are usable (false in builds without CUDA).
bool cuda_usable();

// Device memory on device 0. Errors: no device, out of device memory.
Result<void*> device_alloc(size_t bytes);
void device_free(void* p);  // null: nothing
Status copy_to_device(void* dst, const void* src, size_t bytes);
Status copy_to_host(void* dst, const void* src, size_t bytes);

// Free and total memory of device 0 (cudaMemGetInfo).
Status device_memory(size_t* free_bytes, size_t* total_bytes);

// Streams and events, as handles (null stream: the default stream, on which every kernel below
// runs). stream_create's streams do not wait for the default stream (cudaStreamNonBlocking).
Result<void*> stream_create();
void stream_destroy(void* stream);
Result<void*> event_create();
void event_destroy(void* event);
Status event_record(void* event, void* stream);
Status stream_wait_event(void* stream, void* event);
// Whether the work the event marks has completed (an event never recorded has).
Result<bool> event_done(void* event);
Status event_synchronize(void* event);
// Page-locked host memory, which asynchronous copies need to be asynchronous.
Result<void*> pinned_alloc(size_t bytes);
void pinned_free(void* p);
// Copies on `stream` that return at once (src / dst: pinned host memory).
Status copy_to_device_async(void* dst, const void* src, size_t bytes, void* stream);
Status copy_to_host_async(void* dst, const void* src, size_t bytes, void* stream);
Status memset_async(void* dst, int value, size_t bytes, void* stream);

// The routed experts' rows: dst[i] = src[rows[i]] (n rows of width floats), and
// dst[rows[i]] += scale[i] * src[i]; rows within one scatter are distinct.
Status cuda_gather_rows(const float* src, const int32_t* rows, int64_t n, int64_t width, float* dst);
Status cuda_scatter_add_rows(float* dst, const int32_t* rows, const float* scale, int64_t n, int64_t width,
                             const float* src);

// What cuda_matmul uses for large batches: "cuBLAS (libcublas.so.13) from 64 tokens", or "none
// (...)" when libcublas cannot be loaded (strata's kernel then takes every batch).
std::string cuda_gemm_library();

// Whether cuda_matmul has a kernel for weights of `type`.
bool cuda_has_matmul(GgmlType type);
// y[t][r] = sum_k W[r][k] x[t][k] for r < n_rows, t < n_tok. w: n_rows rows of row_bytes in the
// file's layout (not row-interleaved), x [n_tok][n_cols], y [n_tok][n_rows], all on the device.
Status cuda_matmul(GgmlType type, const uint8_t* w, int64_t n_rows, int64_t n_cols, size_t row_bytes, const float* x,
                   int64_t n_tok, float* y);
// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w for n_rows rows of n floats (w may be null; out may alias x).
Status cuda_rms_norm(const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* out);

// cpu::RopeParams as plain numbers (cpu/ops.h: NEOX or NORM pairing, YaRN when ext_factor != 0).
struct RopeArgs {
  bool neox = true;
  int n_rot = 0;
  float freq_base = 10000.0f, factor = 1.0f;
  int n_ctx_orig = 0;
  float beta_fast = 32.0f, beta_slow = 1.0f, ext_factor = 0.0f, attn_factor = 1.0f;
};
// Rotates n_tok tokens of n_head heads of head_dim in place: x [n_tok][n_head][head_dim], token t
// at position pos0 + t.
Status cuda_rope(float* x, int64_t n_tok, int n_head, int head_dim, int64_t pos0, const RopeArgs& p);

// Causal GQA attention (blocks.h attention_gqa) over a copy of one layer's KvCache rows 0 .. kv_len
// in its layout: K in transposed key blocks [n_head_kv][k_blocks][head_dim_k][32], V by head
// [n_head_kv][v_rows][head_dim_v], half or float. q [n_tok][n_head][head_dim_k] (unscaled),
// out [n_tok][n_head][head_dim_v]; query t at position pos0 + t sees keys max(0, pos - n_swa + 1)
// .. pos (all up to pos when n_swa is 0); sinks [n_head] (device, may be null).
struct AttentionArgs {
  int n_head = 0, n_head_kv = 0, head_dim_k = 0, head_dim_v = 0;
  float scale = 0;
  int n_swa = 0;
  const float* sinks = nullptr;
  bool half = false;
  int64_t k_blocks = 0, v_rows = 0;
};
Status cuda_attention(const AttentionArgs& a, const float* q, const void* k, const void* v, int64_t n_tok,
                      int64_t pos0, float* out);

// MLA's attention core (Backend::attention_mla) over a copy of one layer's latent rows
// [kv_len][kv_lora + rope] (float, KvCache::k_row's layout): q [n_tok][n_head][kv_lora + rope],
// out [n_tok][n_head][kv_lora]; query t at position pos0 + t sees rows 0 .. pos0 + t.
Status cuda_attention_mla(int n_head, int kv_lora, int rope, float scale, const float* q, const float* rows,
                          int64_t n_tok, int64_t pos0, float* out);

// The routers' rule (model/blocks.h route_topk) on logits [n_tok][n_exp] (device; overwritten):
// gating 0 softmax, 1 sigmoid, 2 softmax over the chosen, 3 sqrt(softplus) (model.h Gating);
// chosen by score + probs_bias (device, may be null), within the n_group_used best groups by
// top-2 sum when n_group > 1; the k best with ties to the lower id; ids / weights [n_tok][k]
// (device). One warp per token; n_exp up to 1024, k up to 32.
struct RouteArgs {
  int n_exp = 0, k = 0, gating = 0;
  int n_group = 1, n_group_used = 1;
  bool norm_topk = false;
  float scale = 1.0f;
};
bool cuda_route_supported(const RouteArgs& a);
Status cuda_route(const RouteArgs& a, float* logits, const float* probs_bias, int64_t n_tok, int32_t* ids,
                  float* weights);

// g[i] = act(g[i]) * u[i] for n elements: kind 0 silu, 1 gpt-oss's swiglu_oai (alpha, limit),
// 2 silu with clamps (limit); model.h GluKind.
Status cuda_glu(int kind, float alpha, float limit, float* g, const float* u, int64_t n);
// x[t][i] += b[i] for n_rows rows of n (b null: nothing).
Status cuda_add_rows(float* x, const float* b, int64_t n_rows, int64_t n);

}  // namespace strata::gpu
