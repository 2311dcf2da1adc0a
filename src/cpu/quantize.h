// Weight quantizers: a float row into blocks of a storage format, with ggml's reference rules
// (ggml-quants.c quantize_row_*_ref), so a file strata quantizes holds what llama-quantize would
// write without an importance matrix:
//   Q8_0   d = amax / 127, q = round(x / d)                       (ref::quantize_row_q8_0)
//   Q4_0   d = max / -8 (max: the element of largest magnitude, signed), q = min(15, x / d + 8.5)
//   Q4_K   per 32: scale and min by make_qkx2_quants (a weighted least-squares search over 20
//          steps); per 256: the 8 scales and mins as 6-bit multiples of d and dmin
//   Q6_K   per 16: scale by make_qx_quants (rmse_type 1, 18 alternative scales); per 256: the
//          16 scales as int8 multiples of d
//   MXFP4  per 32: e = floor(log2(amax)) - 2 (E8M0), each value the nearest of the E2M1 codebook
//   F16    IEEE half, round to nearest even
// Rounding to integers is to nearest, ties to even (ggml's nearest_int), except Q8_0's roundf.
// Lengths are multiples of the format's block size (checked).
#pragma once

#include <cstdint>

#include "cpu/ggml_type.h"

namespace strata {

// Whether quantize_row() can write `type`.
bool can_quantize(GgmlType type);

// x[0..n) into `out`, which holds ggml_row_bytes(type, n) bytes.
void quantize_row(GgmlType type, const float* x, void* out, int64_t n);

}  // namespace strata
