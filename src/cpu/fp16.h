// Scalar, bit-exact conversions between float and the 16-bit float formats of GGUF (IEEE half,
// bfloat16). Round to nearest even, as ggml does.
#pragma once

#include <cstdint>
#include <cstring>

namespace strata {

inline float bits_to_f32(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
inline uint32_t f32_to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

inline float fp16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  if (exp == 0) {
    // zero or subnormal: mant * 2^-24
    float v = float(mant) * bits_to_f32(0x33800000u);  // 2^-24
    return sign ? -v : v;
  }
  if (exp == 31) return bits_to_f32(sign | 0x7f800000u | (mant << 13));  // inf / nan
  return bits_to_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

inline uint16_t f32_to_fp16(float f) {
  const uint32_t x = f32_to_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t abs = x & 0x7fffffff;
  if (abs >= 0x7f800000u) return uint16_t(sign | 0x7c00 | (abs > 0x7f800000u ? 0x200 : 0));
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00);  // rounds to infinity
  if (abs < 0x38800000u) {
    // subnormal half (or zero): round abs * 2^24 to an integer, nearest even
    const float v = bits_to_f32(abs) * 16777216.0f;
    uint32_t m = uint32_t(v);
    const float rem = v - float(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1))) ++m;
    return uint16_t(sign | m);
  }
  // normal: drop 13 mantissa bits with round to nearest even
  uint32_t r = abs - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfff + ((r >> 13) & 1);
  return uint16_t(sign | (r >> 13));
}

inline float bf16_to_f32(uint16_t h) { return bits_to_f32(uint32_t(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t x = f32_to_bits(f);
  if ((x & 0x7fffffff) > 0x7f800000u) return uint16_t((x >> 16) | 64);  // quiet nan
  return uint16_t((x + (0x7fff + ((x >> 16) & 1))) >> 16);
}

}  // namespace strata
