// AVX2 tile kernels (kernels.h GemmFn). None yet: every type falls back to KernelTable::gemm_tile's
// loop over the AVX2 vec_dot.
#include "cpu/kernels.h"

namespace strata::cpu::detail {

void add_avx2_gemm(GemmFn* /*gemm*/) {}

}  // namespace strata::cpu::detail
