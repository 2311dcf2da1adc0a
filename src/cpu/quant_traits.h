// One table of what strata can do with each ggml tensor type (STYLE.md 3): block geometry, the
// scalar reference dequantize, the activation format a quantized matmul uses for it, and the
// reference dot product. Indexed by GgmlType; types strata cannot compute have supported == false
// and null functions, so a loader can reject a model with a message (check_weight_type) instead of
// crashing in a kernel.
//
// The functions here are the scalar references of quant_ref.h behind type-erased pointers. The
// SIMD kernels get their own tables with the same signatures; this one is what they are tested
// against.
#pragma once

#include <cstdint>
#include <string_view>

#include "base/error.h"
#include "cpu/ggml_type.h"

namespace strata {

// y[0..n) <- a row of n elements stored in the type (n a multiple of the block size).
using DequantizeRowFn = void (*)(const void* x, float* y, int64_t n);
// A row of n elements in the type <- x[0..n).
using QuantizeRowFn = void (*)(const float* x, void* y, int64_t n);
// Dot product of one weight row `w` (n elements in the weight type) with one activation row `a`
// (n elements in the weight type's vec_dot_type: float* when that is f32, else blocks).
using VecDotFn = float (*)(int64_t n, const void* w, const void* a);

struct QuantTraits {
  GgmlType type = GgmlType::f32;
  std::string_view name;    // ggml's name: "q4_K"
  bool supported = false;   // usable as matmul weights: dequantize_row, vec_dot set
  uint32_t block_size = 0;  // elements per block
  uint32_t type_size = 0;   // bytes per block
  DequantizeRowFn dequantize_row = nullptr;  // null when strata cannot decode the type
  // Float row -> this type; set for the activation formats (q8_0, q8_1, q8_K) and the float types.
  QuantizeRowFn from_float = nullptr;
  // Format of the activations in vec_dot (ggml's vec_dot_type, except that f16 / bf16 weights
  // take f32 activations in strata); f32 means the activations stay float.
  GgmlType vec_dot_type = GgmlType::f32;
  VecDotFn vec_dot = nullptr;  // reference dot of one weight row and one vec_dot_type row
  // Float activations -> vec_dot_type (the from_float of vec_dot_type); null when it is f32.
  QuantizeRowFn quantize_activation = nullptr;
};

// Traits of any type the enum names (unsupported ones included).
const QuantTraits& quant_traits(GgmlType type);

// Ok when strata can compute with weights of `type`; otherwise an Error naming the tensor and the
// type: "tensor blk.0.ffn_up.weight has type iq2_xxs, which strata cannot compute yet (it computes
// f32, f16, ...)".
Status check_weight_type(GgmlType type, std::string_view tensor_name);

// The exact reference: dequantize the weight row, then sum w[i] * x[i] in double with the float
// activations x (no activation quantization). `type` must be able to dequantize.
double vec_dot_exact(GgmlType type, int64_t n, const void* w, const float* x);

}  // namespace strata
