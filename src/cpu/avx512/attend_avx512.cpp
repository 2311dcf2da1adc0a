// Decode attention, AVX-512 build of ../avx2/attend_impl.h (256-bit vectors; the compiler has 32
// registers and EVEX encodings).
#include "cpu/avx2/attend_impl.h"

namespace strata::cpu::detail {
void add_attend_avx512(AttendFn* attend) { add_attend_simd(attend); }
}  // namespace strata::cpu::detail
