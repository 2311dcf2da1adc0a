// The ggml tensor types a GGUF file can name: ids as on disk, elements per block and bytes per
// block. This table is what the reader uses to size tensors; the block structs and kernels for the
// types the engine computes with live in src/cpu (quant_blocks.h) and static_assert against it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace strata {

// Values are the on-disk ids of ggml.h (gaps are ids ggml retired).
enum class GgmlType : uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q8_1 = 9,
  q2_k = 10,
  q3_k = 11,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  q8_k = 15,
  iq2_xxs = 16,
  iq2_xs = 17,
  iq3_xxs = 18,
  iq1_s = 19,
  iq4_nl = 20,
  iq3_s = 21,
  iq2_s = 22,
  iq4_xs = 23,
  i8 = 24,
  i16 = 25,
  i32 = 26,
  i64 = 27,
  f64 = 28,
  iq1_m = 29,
  bf16 = 30,
  tq1_0 = 34,
  tq2_0 = 35,
  mxfp4 = 39,
};

struct GgmlTypeTraits {
  GgmlType type;
  std::string_view name;  // as ggml prints it: "q4_K", "bf16", "mxfp4"
  uint32_t block_size;    // elements per block
  uint32_t type_size;     // bytes per block
};

// Block sizes and bytes exactly as ggml-common.h defines the block structs.
inline constexpr std::array<GgmlTypeTraits, 32> kGgmlTypeTable = {{
    {GgmlType::f32, "f32", 1, 4},
    {GgmlType::f16, "f16", 1, 2},
    {GgmlType::q4_0, "q4_0", 32, 18},
    {GgmlType::q4_1, "q4_1", 32, 20},
    {GgmlType::q5_0, "q5_0", 32, 22},
    {GgmlType::q5_1, "q5_1", 32, 24},
    {GgmlType::q8_0, "q8_0", 32, 34},
    {GgmlType::q8_1, "q8_1", 32, 36},
    {GgmlType::q2_k, "q2_K", 256, 84},
    {GgmlType::q3_k, "q3_K", 256, 110},
    {GgmlType::q4_k, "q4_K", 256, 144},
    {GgmlType::q5_k, "q5_K", 256, 176},
    {GgmlType::q6_k, "q6_K", 256, 210},
    {GgmlType::q8_k, "q8_K", 256, 292},
    {GgmlType::iq2_xxs, "iq2_xxs", 256, 66},
    {GgmlType::iq2_xs, "iq2_xs", 256, 74},
    {GgmlType::iq3_xxs, "iq3_xxs", 256, 98},
    {GgmlType::iq1_s, "iq1_s", 256, 50},
    {GgmlType::iq4_nl, "iq4_nl", 32, 18},
    {GgmlType::iq3_s, "iq3_s", 256, 110},
    {GgmlType::iq2_s, "iq2_s", 256, 82},
    {GgmlType::iq4_xs, "iq4_xs", 256, 136},
    {GgmlType::i8, "i8", 1, 1},
    {GgmlType::i16, "i16", 1, 2},
    {GgmlType::i32, "i32", 1, 4},
    {GgmlType::i64, "i64", 1, 8},
    {GgmlType::f64, "f64", 1, 8},
    {GgmlType::iq1_m, "iq1_m", 256, 56},
    {GgmlType::bf16, "bf16", 1, 2},
    {GgmlType::tq1_0, "tq1_0", 256, 54},
    {GgmlType::tq2_0, "tq2_0", 256, 66},
    {GgmlType::mxfp4, "mxfp4", 32, 17},
}};

// Bytes per block, usable in static_assert (quant_blocks.h checks its structs against it).
constexpr uint32_t ggml_block_bytes(GgmlType type) {
  for (const auto& t : kGgmlTypeTable) {
    if (t.type == type) return t.type_size;
  }
  return 0;
}

// Traits of a known type id, or nullopt for an id ggml does not define (or retired).
std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t id);
// Traits of a type that is known by construction.
const GgmlTypeTraits& ggml_traits(GgmlType type);
// Case-insensitive lookup by name ("q4_k", "Q4_K", "mxfp4").
std::optional<GgmlType> ggml_type_from_name(std::string_view name);
std::string_view ggml_type_name(GgmlType type);

// Bytes of a row of `n_elements` elements; n_elements must be a multiple of the block size.
inline uint64_t ggml_row_bytes(GgmlType type, uint64_t n_elements) {
  const GgmlTypeTraits& t = ggml_traits(type);
  return n_elements / t.block_size * t.type_size;
}

}  // namespace strata
