#include "cpu/quant_traits.h"

#include <array>
#include <string>
#include <vector>

#include "cpu/fp16.h"
#include "cpu/quant_ref.h"

namespace strata {
namespace {

// Adapters from the typed reference functions to the type-erased table signatures.
template <class Block, void (*F)(const Block*, float*, int64_t)>
void dequantize_erased(const void* x, float* y, int64_t n) {
  F(static_cast<const Block*>(x), y, n);
}
template <class Block, void (*F)(const float*, Block*, int64_t)>
void quantize_erased(const float* x, void* y, int64_t n) {
  F(x, static_cast<Block*>(y), n);
}
template <class W, class A, float (*F)(int64_t, const W*, const A*)>
float vec_dot_erased(int64_t n, const void* w, const void* a) {
  return F(n, static_cast<const W*>(w), static_cast<const A*>(a));
}

void from_float_f32(const float* x, void* y, int64_t n) {
  float* out = static_cast<float*>(y);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i];
}
void from_float_f16(const float* x, void* y, int64_t n) {
  uint16_t* out = static_cast<uint16_t*>(y);
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_fp16(x[i]);
}
void from_float_bf16(const float* x, void* y, int64_t n) {
  uint16_t* out = static_cast<uint16_t*>(y);
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(x[i]);
}

constexpr size_t kTableSize = 40;  // ggml ids 0..39 (mxfp4 = 39)

struct Implemented {
  GgmlType type;
  DequantizeRowFn dequantize_row;
  QuantizeRowFn from_float;
  GgmlType vec_dot_type;
  VecDotFn vec_dot;  // null for the activation-only formats q8_1, q8_K
};

using namespace ref;

// What strata implements. vec_dot_type is ggml's (type_traits_cpu) except f16 / bf16.
const Implemented kImplemented[] = {
    {GgmlType::f32, dequantize_erased<float, dequantize_row_f32>, from_float_f32, GgmlType::f32,
     vec_dot_erased<float, float, vec_dot_f32_f32>},
    {GgmlType::f16, dequantize_erased<uint16_t, dequantize_row_f16>, from_float_f16, GgmlType::f32,
     vec_dot_erased<uint16_t, float, vec_dot_f16_f32>},
    {GgmlType::bf16, dequantize_erased<uint16_t, dequantize_row_bf16>, from_float_bf16,
     GgmlType::f32, vec_dot_erased<uint16_t, float, vec_dot_bf16_f32>},
    {GgmlType::q4_0, dequantize_erased<block_q4_0, dequantize_row_q4_0>, nullptr, GgmlType::q8_0,
     vec_dot_erased<block_q4_0, block_q8_0, vec_dot_q4_0_q8_0>},
    {GgmlType::q4_1, dequantize_erased<block_q4_1, dequantize_row_q4_1>, nullptr, GgmlType::q8_1,
     vec_dot_erased<block_q4_1, block_q8_1, vec_dot_q4_1_q8_1>},
    {GgmlType::q5_0, dequantize_erased<block_q5_0, dequantize_row_q5_0>, nullptr, GgmlType::q8_0,
     vec_dot_erased<block_q5_0, block_q8_0, vec_dot_q5_0_q8_0>},
    {GgmlType::q5_1, dequantize_erased<block_q5_1, dequantize_row_q5_1>, nullptr, GgmlType::q8_1,
     vec_dot_erased<block_q5_1, block_q8_1, vec_dot_q5_1_q8_1>},
    {GgmlType::q8_0, dequantize_erased<block_q8_0, dequantize_row_q8_0>,
     quantize_erased<block_q8_0, quantize_row_q8_0>, GgmlType::q8_0,
     vec_dot_erased<block_q8_0, block_q8_0, vec_dot_q8_0_q8_0>},
    {GgmlType::q8_1, dequantize_erased<block_q8_1, dequantize_row_q8_1>,
     quantize_erased<block_q8_1, quantize_row_q8_1>, GgmlType::q8_1, nullptr},
    {GgmlType::q2_k, dequantize_erased<block_q2_K, dequantize_row_q2_K>, nullptr, GgmlType::q8_k,
     vec_dot_erased<block_q2_K, block_q8_K, vec_dot_q2_K_q8_K>},
    {GgmlType::q3_k, dequantize_erased<block_q3_K, dequantize_row_q3_K>, nullptr, GgmlType::q8_k,
     vec_dot_erased<block_q3_K, block_q8_K, vec_dot_q3_K_q8_K>},
    {GgmlType::q4_k, dequantize_erased<block_q4_K, dequantize_row_q4_K>, nullptr, GgmlType::q8_k,
     vec_dot_erased<block_q4_K, block_q8_K, vec_dot_q4_K_q8_K>},
    {GgmlType::q5_k, dequantize_erased<block_q5_K, dequantize_row_q5_K>, nullptr, GgmlType::q8_k,
     vec_dot_erased<block_q5_K, block_q8_K, vec_dot_q5_K_q8_K>},
    {GgmlType::q6_k, dequantize_erased<block_q6_K, dequantize_row_q6_K>, nullptr, GgmlType::q8_k,
     vec_dot_erased<block_q6_K, block_q8_K, vec_dot_q6_K_q8_K>},
    {GgmlType::q8_k, dequantize_erased<block_q8_K, dequantize_row_q8_K>,
     quantize_erased<block_q8_K, quantize_row_q8_K>, GgmlType::q8_k, nullptr},
    {GgmlType::iq4_nl, dequantize_erased<block_iq4_nl, dequantize_row_iq4_nl>, nullptr,
     GgmlType::q8_0, vec_dot_erased<block_iq4_nl, block_q8_0, vec_dot_iq4_nl_q8_0>},
    {GgmlType::iq4_xs, dequantize_erased<block_iq4_xs, dequantize_row_iq4_xs>, nullptr,
     GgmlType::q8_k, vec_dot_erased<block_iq4_xs, block_q8_K, vec_dot_iq4_xs_q8_K>},
    {GgmlType::mxfp4, dequantize_erased<block_mxfp4, dequantize_row_mxfp4>, nullptr, GgmlType::q8_0,
     vec_dot_erased<block_mxfp4, block_q8_0, vec_dot_mxfp4_q8_0>},
};

std::array<QuantTraits, kTableSize> build_table() {
  std::array<QuantTraits, kTableSize> table{};
  // geometry and names of every type ggml defines, from the one table the GGUF reader uses
  for (const GgmlTypeTraits& g : kGgmlTypeTable) {
    const size_t id = size_t(g.type);
    STRATA_CHECK(id < kTableSize);
    table[id].type = g.type;
    table[id].name = g.name;
    table[id].block_size = g.block_size;
    table[id].type_size = g.type_size;
  }
  for (const Implemented& impl : kImplemented) {
    QuantTraits& t = table[size_t(impl.type)];
    t.dequantize_row = impl.dequantize_row;
    t.from_float = impl.from_float;
    t.vec_dot_type = impl.vec_dot_type;
    t.vec_dot = impl.vec_dot;
    t.supported = impl.dequantize_row != nullptr && impl.vec_dot != nullptr;
  }
  // the activation quantizer of each weight type is the from_float of its vec_dot_type
  for (QuantTraits& t : table) {
    if (t.supported && t.vec_dot_type != GgmlType::f32) {
      t.quantize_activation = table[size_t(t.vec_dot_type)].from_float;
      STRATA_CHECK(t.quantize_activation != nullptr, "vec_dot_type without a quantizer");
    }
  }
  return table;
}

const std::array<QuantTraits, kTableSize>& table() {
  static const std::array<QuantTraits, kTableSize> t = build_table();
  return t;
}

}  // namespace

const QuantTraits& quant_traits(GgmlType type) {
  const size_t id = size_t(type);
  STRATA_CHECK(id < kTableSize && table()[id].block_size != 0, "GgmlType value outside the table");
  return table()[id];
}

Status check_weight_type(GgmlType type, std::string_view tensor_name) {
  const QuantTraits& t = quant_traits(type);
  if (t.supported) return Status::success();
  std::string computable;
  for (const QuantTraits& s : table()) {
    if (!s.supported) continue;
    if (!computable.empty()) computable += ", ";
    computable += s.name;
  }
  return Error{strfmt("tensor %.*s has type %.*s, which strata cannot compute yet (it computes %s)",
                      int(tensor_name.size()), tensor_name.data(), int(t.name.size()),
                      t.name.data(), computable.c_str())};
}

double vec_dot_exact(GgmlType type, int64_t n, const void* w, const float* x) {
  const QuantTraits& t = quant_traits(type);
  STRATA_CHECK(t.dequantize_row != nullptr, "vec_dot_exact of a type strata cannot decode");
  std::vector<float> wf(static_cast<size_t>(n));
  t.dequantize_row(w, wf.data(), n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += double(wf[size_t(i)]) * double(x[i]);
  return sum;
}

}  // namespace strata
