// Scalar fp32 <-> bf16 / fp16 conversions, round to nearest even, NaN kept quiet. Used by the
// scalar variant (baseline x86-64 has no F16C) and by the vector variants' reference tests.
#pragma once

#include <cstdint>
#include <cstring>

namespace ds {
namespace optim {

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0) {
    // Zero or subnormal: m * 2^-24 is exact in fp32.
    const float v = static_cast<float>(m) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  if (e == 31) return bits_f32(sign | 0x7F800000u | (m << 13));
  return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

inline uint16_t f32_to_f16(float f) {
  uint32_t x = f32_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7FFFFFFFu;
  if (x >= 0x7F800000u) return static_cast<uint16_t>(sign | (x > 0x7F800000u ? 0x7E00u : 0x7C00u));
  if (x >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds past 65504
  if (x < 0x38800000u) {
    // Below the smallest normal half: adding 0.5 puts the value's 2^-24 units in the low
    // mantissa bits, and the FPU rounds them to nearest even.
    const float a = bits_f32(x) + 0.5f;
    return static_cast<uint16_t>(sign | (f32_bits(a) - 0x3F000000u));
  }
  x += 0xC8000FFFu + ((x >> 13) & 1u);  // rebias exponent (-112) and round to nearest even
  return static_cast<uint16_t>(sign | (x >> 13));
}

}  // namespace optim
}  // namespace ds
