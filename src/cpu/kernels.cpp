#include "cpu/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "base/error.h"
#include "cpu/fp16.h"

namespace strata::cpu {
namespace {

// The reference entries of every table: quant_traits' functions.
KernelTable reference_table() {
  KernelTable t;
  t.isa = CpuIsa::scalar;
  for (const GgmlTypeTraits& g : kGgmlTypeTable) {
    STRATA_CHECK(size_t(g.type) < kKernelTypeCount);
    t.vec_dot[size_t(g.type)] = quant_traits(g.type).vec_dot;
  }
  for (GgmlType a : {GgmlType::q8_0, GgmlType::q8_1, GgmlType::q8_k})
    t.quantize_row[size_t(a)] = quant_traits(a).from_float;
  t.sgemm = detail::sgemm_ref;
  t.exp_sum = detail::exp_sum_ref;
  t.silu_mul = detail::silu_mul_ref;
  t.axpy = detail::axpy_ref;
  t.scale = detail::scale_ref;
  t.half_to_float = detail::half_to_float_ref;
  detail::add_attend_ref(t.attend.data());
  return t;
}

KernelTable build_table(CpuIsa isa) {
  KernelTable t = reference_table();
  t.isa = isa;
#if STRATA_X86_KERNELS
  // layered: an AVX-512 table starts from the AVX2 one and overwrites what it does better
  if (isa >= CpuIsa::avx2) {
    detail::add_avx2_kernels(t.vec_dot.data(), t.quantize_row.data());
    detail::add_avx2_vec_dot_tokens(t.vec_dot_tokens.data());
    detail::add_avx2_gemm(t.gemm.data());
    detail::add_avx2_gemm_interleaved(t.gemm_interleaved.data());
    t.sgemm = detail::sgemm_avx2;
    t.exp_sum = detail::exp_sum_avx2;
    t.silu_mul = detail::silu_mul_avx2;
    t.axpy = detail::axpy_avx2;
    t.scale = detail::scale_avx2;
    t.half_to_float = detail::half_to_float_avx2;
    detail::add_attend_avx2(t.attend.data());
  }
  if (isa >= CpuIsa::avx512) {
    detail::add_avx512_kernels(t.vec_dot.data(), t.quantize_row.data());
    t.vec_dot_tokens = {};  // AVX2's would not match AVX-512's vec_dot bit for bit
    detail::add_avx512_gemm(t.gemm.data());
    t.gemm_interleaved = {};  // AVX-512 interleaves the types it has kernels for
    detail::add_avx512_gemm_interleaved(t.gemm_interleaved.data());
    t.sgemm = detail::sgemm_avx512;
    t.exp_sum = detail::exp_sum_avx512;
    t.silu_mul = detail::silu_mul_avx512;
    t.axpy = detail::axpy_avx512;
    t.scale = detail::scale_avx512;
    t.half_to_float = detail::half_to_float_avx512;
    detail::add_attend_avx512(t.attend.data());
    t.scores_q8 = detail::scores_q8_avx512();
  }
#endif
  return t;
}

}  // namespace

void detail::sgemm_ref(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                       int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = accumulate ? double(C[m * ldc + n]) : 0.0;
      for (int64_t k = 0; k < K; ++k) s += double(A[m * lda + k]) * double(B[k * ldb + n]);
      C[m * ldc + n] = float(s);
    }
}

void detail::silu_mul_ref(float* g, const float* u, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

void detail::axpy_ref(float* y, const float* x, float a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::fma(a, x[i], y[i]);
}

void detail::scale_ref(float* y, const float* x, float a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a * x[i];
}

void detail::half_to_float_ref(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = fp16_to_f32(x[i]);
}

float detail::exp_sum_ref(const float* x, float* y, int64_t n, float max) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    y[i] = std::exp(x[i] - max);
    sum += y[i];
  }
  return float(sum);
}

// 4 KiB: one thread reading Q6_K / Q8_0 from DRAM 21 -> 23.5 GB/s (MXFP4, BF16 within the noise)
constexpr size_t kPrefetchBytes = 4096;

void KernelTable::gemm_tile(GgmlType weight, int64_t n, const void* w, size_t w_stride,
                            int64_t n_rows, const void* a, size_t a_stride, int64_t n_tok, float* y,
                            int64_t ldy) const {
  // one activation row (decode): the matrix-vector kernel streams the weights; a tile kernel's
  // unpacking pays off only when it serves several rows. Up to kBatchInvariantTokens rows (a
  // speculative verification) each token's result must be bit-identical to one-token decoding:
  // vec_dot_tokens where the ISA has it (the row unpacked once per 8 tokens: AVX2 Q4_K and
  // Q6_K, a k = 8 verification step of the 24-layer Qwen3-30B-A3B synthetic 471 -> 338-349 ms on
  // 2 cores), else vec_dot per token (the row stays in L1).
  if (const GemmFn g = gemm[size_t(weight)]; g != nullptr && n_tok > kBatchInvariantTokens)
    return g(n, w, w_stride, n_rows, a, a_stride, n_tok, y, ldy);
  const VecDotFn dot = vec_dot[size_t(weight)];
  STRATA_CHECK(dot != nullptr, "weight type without vec_dot (loader must reject)");
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* ab = static_cast<const uint8_t*>(a);
  // several tokens: each row unpacked once for all of them, where the ISA can (same results)
  const VecDotTokensFn dots = n_tok > 1 ? vec_dot_tokens[size_t(weight)] : nullptr;
  // the weights asked for kPrefetchBytes ahead of need (within this tile's rows): the hardware
  // prefetchers alone leave a thread well below the bandwidth a GEMV needs (see kPrefetchAhead in
  // avx512/gemm_avx512.cpp)
  const uint8_t* const end = wb + size_t(n_rows) * w_stride;
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint8_t* row = wb + size_t(r) * w_stride;
    for (const uint8_t* p = row + kPrefetchBytes; p < std::min(end, row + w_stride + kPrefetchBytes); p += 64)
      __builtin_prefetch(p);
    if (dots != nullptr) {
      dots(n, row, ab, a_stride, n_tok, y + r, ldy);
      continue;
    }
    for (int64_t t = 0; t < n_tok; ++t) y[t * ldy + r] = dot(n, row, ab + size_t(t) * a_stride);
  }
}

bool isa_supported(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::scalar:
      return true;
#if STRATA_X86_KERNELS
    case CpuIsa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case CpuIsa::avx512:
#ifdef STRATA_AVX512_EMULATION
      // the tests' emulated build (tests/avx512_emulation): the AVX-512 kernels on AVX2
      return isa_supported(CpuIsa::avx2);
#else
      return isa_supported(CpuIsa::avx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni");
#endif
#else
    default:
      return false;
#endif
  }
  return false;
}

CpuIsa best_supported_isa() {
  if (isa_supported(CpuIsa::avx512)) return CpuIsa::avx512;
  if (isa_supported(CpuIsa::avx2)) return CpuIsa::avx2;
  return CpuIsa::scalar;
}

std::string_view isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::scalar: return "scalar";
    case CpuIsa::avx2: return "avx2";
    case CpuIsa::avx512: return "avx512";
  }
  return "?";
}

std::optional<CpuIsa> parse_isa(std::string_view name) {
  if (name == "scalar" || name == "ref") return CpuIsa::scalar;
  if (name == "avx2") return CpuIsa::avx2;
  if (name == "avx512") return CpuIsa::avx512;
  return std::nullopt;
}

CpuIsa select_isa(const char* env_value) {
  const CpuIsa best = best_supported_isa();
  if (env_value == nullptr || env_value[0] == '\0') return best;
  const std::optional<CpuIsa> want = parse_isa(env_value);
  if (!want) {
    std::fprintf(stderr, "strata: STRATA_ISA=%s is not one of scalar, avx2, avx512; using %s\n",
                 env_value, isa_name(best).data());
    return best;
  }
  if (*want > best) {
    std::fprintf(stderr, "strata: STRATA_ISA=%s but this CPU supports at most %s; using %s\n",
                 env_value, isa_name(best).data(), isa_name(best).data());
    return best;
  }
  return *want;
}

const KernelTable& cpu_kernels(CpuIsa isa) {
  STRATA_CHECK(isa_supported(isa), "kernel table of an ISA this CPU lacks");
  static const KernelTable tables[] = {build_table(CpuIsa::scalar),
                                       isa_supported(CpuIsa::avx2) ? build_table(CpuIsa::avx2)
                                                                   : reference_table(),
                                       isa_supported(CpuIsa::avx512) ? build_table(CpuIsa::avx512)
                                                                     : reference_table()};
  return tables[size_t(isa)];
}

const KernelTable& cpu_kernels() {
  static const KernelTable& chosen = cpu_kernels(select_isa(std::getenv("STRATA_ISA")));
  return chosen;
}

}  // namespace strata::cpu
