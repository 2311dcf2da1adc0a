// The CPU kernel table: for each weight type the dot-product kernel a matmul calls, and for each
// activation format the quantizer of a float row, in the variant the CPU runs best (STYLE.md 4).
// Chosen once, at the first call of cpu_kernels(), from cpuid (__builtin_cpu_supports); the
// environment variable STRATA_ISA=scalar|avx2|avx512 forces a variant for tests and
// benchmarks ("ref" means scalar). A variant the CPU lacks is never chosen: the request falls
// back to the best supported ISA below it, with a warning on stderr.
//
// Every entry has the signature and the contract of the scalar reference it replaces
// (quant_traits.h, quant_ref.h): same integer sums, float scaling possibly in another order
// (tests/test_simd_kernels.cpp states the tolerance per kernel); the quantizers produce blocks
// bit-identical to the reference for finite input. Where an ISA has no variant of a kernel the
// entry is the reference itself, so every supported type has an entry in every table.
//
// Layout: the variants live in src/cpu/avx2 and src/cpu/avx512, translation units compiled with
// that ISA family's flags (src/cpu/avx512/vbmi: the few that also need AVX-512 VBMI, registered
// only after a run-time check); nothing else in strata is compiled with them, and no intrinsic
// appears outside those directories (but for the tests' emulation of AVX-512 on AVX2 machines,
// tests/avx512_emulation, under which kernels.cpp offers AVX-512 wherever AVX2 runs).
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string_view>

#include "cpu/quant_traits.h"
#include "cpu/ggml_type.h"

namespace strata::cpu {

// Instruction-set families of the kernel variants, in increasing order of capability.
//   avx2:   AVX2 + FMA + F16C (Haswell, Zen 1 and later)
//   avx512: AVX-512 F/BW/VL/DQ + VNNI (+ the AVX2 set): Ice Lake, Sapphire Rapids, Zen 4 / 5
enum class CpuIsa { scalar, avx2, avx512 };

inline constexpr size_t kKernelTypeCount = 40;  // ggml type ids 0..39 (mxfp4 = 39)

// Batches of up to this many tokens (a speculative verification step) are computed so that every
// token's result is bit-identical to evaluating it alone: the matmul kernels run each token's sums
// in the one-token order, and attention runs per token (model/blocks.cpp). Greedy decoding with
// drafts then gives exactly the tokens of plain decoding.
inline constexpr int64_t kBatchInvariantTokens = 12;

// A tile of a matrix product: y[t * ldy + r] = dot(weight row r, activation row t) for r < n_rows,
// t < n_tok. w: n_rows weight rows of w_stride bytes, each n elements in the weight type; a: n_tok
// activation rows of a_stride bytes in the weight type's vec_dot_type (floats when that is f32).
// Same sums as n_rows * n_tok calls of the type's vec_dot; a tile kernel reads each weight block
// once for all n_tok activation rows (prefill), where vec_dot would read it n_tok times. n_rows
// and n_tok may be any positive counts (ragged tails included).
using GemmFn = void (*)(int64_t n, const void* w, size_t w_stride, int64_t n_rows, const void* a,
                        size_t a_stride, int64_t n_tok, float* y, int64_t ldy);
// y[t * ldy] = vec_dot(n, w, a + t * a_stride) for t < n_tok: one weight row, several tokens.
using VecDotTokensFn = void (*)(int64_t n, const void* w, const void* a, size_t a_stride, int64_t n_tok, float* y,
                                int64_t ldy);

// Float matrix product: C[m * ldc + n] (+)= sum_k A[m * lda + k] * B[k * ldb + n] for m < M,
// n < N (accumulate: add to C; else overwrite it). Row-major A [M][K], B [K][N], C [M][N]; any
// sizes >= 0. Attention's two products (scores = Q K^T with K transposed, out = P V) use it.
using SgemmFn = void (*)(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                         int64_t ldb, float* C, int64_t ldc, bool accumulate);

// y[i] = exp(x[i] - max) for i < n (y may be x); returns the sum of the y[i]. An x[i] of -inf
// gives exactly 0. The SIMD variants use a degree-6 polynomial after range reduction (relative
// error a few float ulps, as ggml's vectorised expf).
using ExpSumFn = float (*)(const float* x, float* y, int64_t n, float max);

// g[i] = silu(g[i]) * u[i] = g[i] / (1 + exp(-g[i])) * u[i] for i < n: SwiGLU's gate (the SIMD
// variants use exp_sum's polynomial exp; within 1e-6 relative of the double-precision formula).
using SiluMulFn = void (*)(float* g, const float* u, int64_t n);

// y[i] = fma(a, x[i], y[i]) for i < n (one rounding: bit-identical across ISAs), and
// y[i] = a * x[i]: the forward pass's residual adds, weighted sums and scaled copies, in vectors
// (the code around them is compiled for the baseline ISA).
using AxpyFn = void (*)(float* y, const float* x, float a, int64_t n);
using ScaleFn = void (*)(float* y, const float* x, float a, int64_t n);

// y[i] = the IEEE half x[i] as a float, for i < n (exact: every half is a float). The f16 KV
// cache is read through it.
using HalfToFloatFn = void (*)(const uint16_t* x, float* y, int64_t n);

// The entry formats of a GQA KV cache (model/kv_cache.h holds the rows; cpu/kv_format.h reads and
// writes them). K is stored in transposed blocks of kKvKeyBlock keys: [head_dim][kKvKeyBlock]
// entries. q8_0 keys: each key's dims quantized in groups of 32 as ggml's q8_0, the int8 values
// stored offset by 128 as bytes in groups of 4 dims, [head_dim / 4][kKvKeyBlock][4] (a key's 4
// dims in one dword, as VNNI's vpdpbusd multiplies them: kv_q8_key_offset), then a half scale per
// key and 32 dims, [head_dim / 32][kKvKeyBlock]. V rows by position: head_dim_v entries (q8_0:
// ggml block_q8_0 blocks of 32).
enum class KvType { f32, f16, q8_0 };
inline constexpr int64_t kKvKeyBlock = 32;
// The byte of dim d of key `slot` in a q8_0 key block.
constexpr int64_t kv_q8_key_offset(int64_t d, int64_t slot) { return (d / 4 * kKvKeyBlock + slot) * 4 + d % 4; }

// Decode attention over a range of one kv head's keys (flash attention: the softmax kept online):
// for each of `rows` query rows r (the softmax scale already applied), over keys j in [first, n)
// counted from the start of the key block `k`:
//   s_j = q_r . K_j (q8_0 keys: q_r quantized to q8_0 first, as ggml's q8_0 dot products do, so
//         that each group of 32 dims is an exact integer sum times the two scales);  m' = max(m_r, max_j s_j);  l_r = l_r exp(m_r - m') + sum_j exp(s_j - m');
//   o_r = o_r exp(m_r - m') + sum_j exp(s_j - m') V_j;  m_r = m'.
// Keys of a block outside [first, n) are never read into the sums (their entries may hold
// anything). A caller starts a range at m = -inf, l = 0, o = 0 and merges ranges by their (m, l).
// rows <= kAttendMaxRows; head_dim_v a multiple of 16 (q8_0: both dims multiples of 32, dk at
// most kAttendQ8MaxDim).
inline constexpr int kAttendMaxRows = 16;
inline constexpr int64_t kAttendQ8MaxDim = 512;
struct AttendArgs {
  int rows = 0;
  int64_t dk = 0, dv = 0;
  const float* q = nullptr;  // [rows][dk]
  const uint8_t* k = nullptr;  // the first key block of the range
  size_t k_block_stride = 0;   // bytes from one key block to the next
  // the value row of the key block's first key; q8_0 kernels may read the row after the range's
  // last (weighing it 0), so a cache holds one value row more than its positions
  const uint8_t* v = nullptr;
  size_t v_row_stride = 0;     // bytes from one value row to the next
  int64_t first = 0, n = 0;
  float* m = nullptr;  // [rows]
  float* l = nullptr;  // [rows]
  float* o = nullptr;  // [rows][dv]
};
using AttendFn = void (*)(const AttendArgs& a);

// Query rows prepared for q8_0 keys (cpu/kv_format.h kv_quantize_query): each row quantized to
// q8_0 per 32 dims as ggml rounds, q [rows][dk] int8, d [rows][dk / 32] the scales, off [rows][dk /
// 32] = -128 x the group's sum of q (the keys' bytes are offset by 128).
struct QueryQ8View {
  const int8_t* q = nullptr;
  const float* d = nullptr;
  const int32_t* off = nullptr;
  int64_t dk = 0;
};
// s[r * lds + j] = q_r . K_j for the rows r < rows of q and the keys j < n (<= kKvKeyBlock) of a
// q8_0 key block: per group of 32 dims the exact integer sum times the two scales (prefill's
// scores over a q8_0 cache).
using ScoresQ8Fn = void (*)(const QueryQ8View& q, int rows, const uint8_t* key_block, int64_t n, float* s, int64_t lds);

struct KernelTable {
  CpuIsa isa = CpuIsa::scalar;
  // vec_dot[weight type](n, w, a): one weight row . one activation row in the weight type's
  // vec_dot_type (quant_traits(type).vec_dot_type); null exactly where the reference is null.
  std::array<VecDotFn, kKernelTypeCount> vec_dot{};
  // quantize_row[activation type](x, y, n): float row -> blocks of q8_0 / q8_1 / q8_K (the
  // from_float of those types); null for other types.
  std::array<QuantizeRowFn, kKernelTypeCount> quantize_row{};
  // gemm[weight type]: the tile kernel; null where the ISA has none, and then gemm_tile() loops
  // over vec_dot.
  std::array<GemmFn, kKernelTypeCount> gemm{};
  // gemm_interleaved[weight type]: the tile kernel for row-interleaved weights (cpu/repack.h): w
  // is the start of a group, n_rows a multiple of 16, w_stride the row size in the file (a group
  // is 16 w_stride bytes). It serves every token count, decode included: up to
  // kBatchInvariantTokens tokens, each token's result bit-identical to its one-token result. Null
  // where the ISA has none; weights of that type then stay in the file layout.
  std::array<GemmFn, kKernelTypeCount> gemm_interleaved{};
  // vec_dot_tokens[weight type]: one weight row against 2..kBatchInvariantTokens activation rows,
  // the row unpacked once, each result bit-identical to vec_dot's for that row alone. Null where
  // the ISA has none (gemm_tile then calls vec_dot per token).
  std::array<VecDotTokensFn, kKernelTypeCount> vec_dot_tokens{};
  SgemmFn sgemm = nullptr;  // never null
  ExpSumFn exp_sum = nullptr;  // never null
  SiluMulFn silu_mul = nullptr;  // never null
  AxpyFn axpy = nullptr;          // never null
  ScaleFn scale = nullptr;        // never null
  HalfToFloatFn half_to_float = nullptr;  // never null
  // attend[KvType]: decode attention over f16 / q8_0 (and f32) cache entries; never null
  std::array<AttendFn, 3> attend{};
  // scores_q8: q . K over a q8_0 key block in integers; null where the ISA has none (prefill then
  // widens the keys and multiplies them with the query as kv_query gives it)
  ScoresQ8Fn scores_q8 = nullptr;

  VecDotFn dot(GgmlType weight) const { return vec_dot[size_t(weight)]; }
  // One tile of y = W a (GemmFn's contract) with the best kernel this table has for the type.
  void gemm_tile(GgmlType weight, int64_t n, const void* w, size_t w_stride, int64_t n_rows,
                 const void* a, size_t a_stride, int64_t n_tok, float* y, int64_t ldy) const;
  QuantizeRowFn quantize(GgmlType activation) const { return quantize_row[size_t(activation)]; }
};

// The table chosen at start-up (cpuid, then STRATA_ISA). Thread-safe; never changes.
const KernelTable& cpu_kernels();
// The table of one ISA, for tests and benchmarks that compare variants. The ISA must be supported
// (checked): calling an AVX-512 kernel on a CPU without it faults.
const KernelTable& cpu_kernels(CpuIsa isa);

// Whether this CPU (and its OS) can run the variant.
bool isa_supported(CpuIsa isa);
// The best variant this CPU supports.
CpuIsa best_supported_isa();
// "scalar", "avx2", "avx512".
std::string_view isa_name(CpuIsa isa);
// The name of the variant cpu_kernels() runs.
inline std::string_view isa_name() { return isa_name(cpu_kernels().isa); }
// "scalar" / "ref", "avx2", "avx512" (case-sensitive) -> the ISA; nullopt for anything else.
std::optional<CpuIsa> parse_isa(std::string_view name);
// The ISA cpu_kernels() uses given the value of STRATA_ISA (null: unset): the best supported
// one, or the requested one capped at the best supported. An unknown name means unset. Writes a
// warning to stderr when the request cannot be honoured.
CpuIsa select_isa(const char* env_value);

namespace detail {
// Each ISA directory overwrites the entries it implements (defined in src/cpu/avx2 and
// src/cpu/avx512; called only when the CPU supports the ISA). Plain arrays of kKernelTypeCount
// entries, indexed by type id, so that those translation units instantiate no shared template.
void add_avx2_kernels(VecDotFn* vec_dot, QuantizeRowFn* quantize_row);
// The several-token dot products of vec_dot_avx2.cpp (KernelTable::vec_dot_tokens).
void add_avx2_vec_dot_tokens(VecDotTokensFn* vec_dot_tokens);
void add_avx512_kernels(VecDotFn* vec_dot, QuantizeRowFn* quantize_row);
// The F16 / BF16 weight dot products (vec_dot_float_avx2.cpp, vec_dot_float_avx512.cpp), added
// by add_avx2_kernels / add_avx512_kernels.
void add_avx2_float_kernels(VecDotFn* vec_dot);
void add_avx512_float_kernels(VecDotFn* vec_dot);
// The MXFP4 / Q4_0 / IQ4_NL dot products that also need AVX-512 VBMI (avx512/vbmi/), added by
// add_avx512_kernels when the CPU has it.
void add_avx512_vbmi_kernels(VecDotFn* vec_dot);
// The tile kernels of each ISA (src/cpu/avx2/gemm_avx2.cpp, src/cpu/avx512/gemm_avx512.cpp).
void add_avx2_gemm(GemmFn* gemm);
void add_avx512_gemm(GemmFn* gemm);
// The kernels for row-interleaved weights (gemm_avx2.cpp, src/cpu/avx512/gemm_avx512.cpp).
void add_avx2_gemm_interleaved(GemmFn* gemm);
void add_avx512_gemm_interleaved(GemmFn* gemm);
// The float matrix products (sgemm_avx2.cpp, sgemm_avx512.cpp) and the scalar reference.
void sgemm_avx2(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
                float* C, int64_t ldc, bool accumulate);
void sgemm_avx512(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                  int64_t ldb, float* C, int64_t ldc, bool accumulate);
void sgemm_ref(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
               float* C, int64_t ldc, bool accumulate);
float exp_sum_ref(const float* x, float* y, int64_t n, float max);
void half_to_float_ref(const uint16_t* x, float* y, int64_t n);
// Decode attention (AttendFn) per entry format: the scalar reference, and attend_avx2.cpp's
// kernels (compiled once with the AVX2 flags and once with AVX-512's: attend_avx512.cpp).
void add_attend_ref(AttendFn* attend);
void add_attend_avx2(AttendFn* attend);
void add_attend_avx512(AttendFn* attend);
ScoresQ8Fn scores_q8_avx512();
void half_to_float_avx2(const uint16_t* x, float* y, int64_t n);
void half_to_float_avx512(const uint16_t* x, float* y, int64_t n);
float exp_sum_avx2(const float* x, float* y, int64_t n, float max);
float exp_sum_avx512(const float* x, float* y, int64_t n, float max);
void silu_mul_ref(float* g, const float* u, int64_t n);
void silu_mul_avx2(float* g, const float* u, int64_t n);
void silu_mul_avx512(float* g, const float* u, int64_t n);
void axpy_ref(float* y, const float* x, float a, int64_t n);
void axpy_avx2(float* y, const float* x, float a, int64_t n);
void axpy_avx512(float* y, const float* x, float a, int64_t n);
void scale_ref(float* y, const float* x, float a, int64_t n);
void scale_avx2(float* y, const float* x, float a, int64_t n);
void scale_avx512(float* y, const float* x, float a, int64_t n);
}  // namespace detail

}  // namespace strata::cpu
