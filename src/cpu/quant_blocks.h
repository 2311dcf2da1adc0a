// Quantized block formats, bit-identical to ggml-common.h: the on-disk layout is the in-memory
// layout, so a tensor's bytes (mmap or an O_DIRECT read) are an array of these structs.
// Half-precision scales are stored as raw IEEE binary16 bits (see fp16.h).
#pragma once

#include <cstdint>

#include "cpu/fp16.h"
#include "cpu/ggml_type.h"

namespace strata {

constexpr int QK4_0 = 32, QK4_1 = 32, QK5_0 = 32, QK5_1 = 32, QK8_0 = 32, QK_MXFP4 = 32,
              QK4_NL = 32;
constexpr int QK_K = 256;        // super-block of the K-quants
constexpr int K_SCALE_SIZE = 12;  // packed 6-bit scales and mins of Q4_K / Q5_K

struct block_q4_0 {
  uint16_t d;             // scale
  uint8_t qs[QK4_0 / 2];  // nibbles: element j in low nibble of qs[j], j+16 in the high nibble
};
struct block_q4_1 {
  uint16_t d, m;  // scale, min
  uint8_t qs[QK4_1 / 2];
};
struct block_q5_0 {
  uint16_t d;
  uint8_t qh[4];  // 5th bit of each element
  uint8_t qs[QK5_0 / 2];
};
struct block_q5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[QK5_1 / 2];
};
struct block_q8_0 {
  uint16_t d;
  int8_t qs[QK8_0];
};
struct block_q8_1 {
  uint16_t d, s;  // scale, d * sum(qs)
  int8_t qs[QK8_0];
};
struct block_q2_K {
  uint8_t scales[QK_K / 16];  // 4-bit scales and mins of 16 sub-blocks
  uint8_t qs[QK_K / 4];
  uint16_t d, dmin;
};
struct block_q3_K {
  uint8_t hmask[QK_K / 8];
  uint8_t qs[QK_K / 4];
  uint8_t scales[12];  // 6-bit scales of 16 sub-blocks
  uint16_t d;
};
struct block_q4_K {
  uint16_t d, dmin;               // super-block scale for scales, for mins
  uint8_t scales[K_SCALE_SIZE];   // 8 sub-blocks of 32: 6-bit scale and 6-bit min each
  uint8_t qs[QK_K / 2];
};
struct block_q5_K {
  uint16_t d, dmin;
  uint8_t scales[K_SCALE_SIZE];
  uint8_t qh[QK_K / 8];
  uint8_t qs[QK_K / 2];
};
struct block_q6_K {
  uint8_t ql[QK_K / 2];   // low 4 bits
  uint8_t qh[QK_K / 4];   // high 2 bits
  int8_t scales[QK_K / 16];
  uint16_t d;
};
struct block_q8_K {
  float d;
  int8_t qs[QK_K];
  int16_t bsums[QK_K / 16];  // sums of qs in groups of 16
};
struct block_iq4_nl {
  uint16_t d;
  uint8_t qs[QK4_NL / 2];  // indices into the non-linear table kvalues_iq4nl
};
struct block_iq4_xs {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[QK_K / 64];
  uint8_t qs[QK_K / 2];
};
struct block_mxfp4 {
  uint8_t e;               // E8M0 shared exponent
  uint8_t qs[QK_MXFP4 / 2];  // FP4 (E2M1) values, nibbles as in q4_0
};

// Codebook of IQ4_NL and IQ4_XS: a 4-bit index selects one of these int8 levels (ggml-common.h
// kvalues_iq4nl); the value is d * kvalues_iq4nl[index].
inline constexpr int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                             1,    13,   25,  38,  53,  69,  89,  113};

// Codebook of MXFP4: the FP4 E2M1 values {0, 0.5, 1, 1.5, 2, 3, 4, 6} with sign bit 3, doubled so
// they are integers (ggml-common.h kvalues_mxfp4). Index 8 is -0, stored as 0. The doubling is
// undone by halving the block scale: see e8m0_to_f32_half.
inline constexpr int8_t kvalues_mxfp4[16] = {0, 1,  2,  3,  4,  6,  8,  12,
                                             0, -1, -2, -3, -4, -6, -8, -12};

// Half the value of an E8M0 exponent byte: 2^(e - 127) / 2 = 2^(e - 128), as ggml's
// GGML_E8M0_TO_FP32_HALF computes it. e = 0 and 1 give the subnormals 2^-128 and 2^-127; e = 255
// gives 2^127 (ggml does not treat it as NaN, and neither do we).
inline float e8m0_to_f32_half(uint8_t e) {
  return bits_to_f32(e < 2 ? (0x00200000u << e) : (uint32_t(e - 1) << 23));
}

static_assert(sizeof(block_q4_0) == ggml_block_bytes(GgmlType::q4_0));
static_assert(sizeof(block_q4_1) == ggml_block_bytes(GgmlType::q4_1));
static_assert(sizeof(block_q5_0) == ggml_block_bytes(GgmlType::q5_0));
static_assert(sizeof(block_q5_1) == ggml_block_bytes(GgmlType::q5_1));
static_assert(sizeof(block_q8_0) == ggml_block_bytes(GgmlType::q8_0));
static_assert(sizeof(block_q8_1) == ggml_block_bytes(GgmlType::q8_1));
static_assert(sizeof(block_q2_K) == ggml_block_bytes(GgmlType::q2_k));
static_assert(sizeof(block_q3_K) == ggml_block_bytes(GgmlType::q3_k));
static_assert(sizeof(block_q4_K) == ggml_block_bytes(GgmlType::q4_k));
static_assert(sizeof(block_q5_K) == ggml_block_bytes(GgmlType::q5_k));
static_assert(sizeof(block_q6_K) == ggml_block_bytes(GgmlType::q6_k));
static_assert(sizeof(block_q8_K) == ggml_block_bytes(GgmlType::q8_k));
static_assert(sizeof(block_iq4_nl) == ggml_block_bytes(GgmlType::iq4_nl));
static_assert(sizeof(block_iq4_xs) == ggml_block_bytes(GgmlType::iq4_xs));
static_assert(sizeof(block_mxfp4) == ggml_block_bytes(GgmlType::mxfp4));

}  // namespace strata
