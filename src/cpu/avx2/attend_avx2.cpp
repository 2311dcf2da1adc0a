// Decode attention, AVX2 + FMA + F16C build of attend_impl.h.
#include "cpu/avx2/attend_impl.h"

namespace strata::cpu::detail {
void add_attend_avx2(AttendFn* attend) { add_attend_simd(attend); }
}  // namespace strata::cpu::detail
