// AVX-512 + VNNI tile kernels (kernels.h GemmFn). None yet: every type falls back to
// KernelTable::gemm_tile's loop over the AVX-512 vec_dot.
#include "cpu/kernels.h"

namespace strata::cpu::detail {

void add_avx512_gemm(GemmFn* /*gemm*/) {}

}  // namespace strata::cpu::detail
