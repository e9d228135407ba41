// Inline fp8 encoder shared by the quantization kernels.
#pragma once

#include <cstdint>
#include <cstring>

#include "ds/quant.h"

namespace ds::quant {

const float* fp8_table(Fp8Format f);

// Internal linkage: every ISA variant gets its own copy compiled with its own flags, so the
// linker can never hand the baseline code an AVX-512 instance of a shared inline function.
namespace {

inline uint32_t f32_bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

inline float bits_f32(uint32_t b) {
  float v;
  std::memcpy(&v, &b, 4);
  return v;
}

// Round-half-to-even encode of a finite |y| <= max into M mantissa bits and exponent bias BIAS.
// Subnormals: adding 2^(emin - M + 23) makes the FPU round at the subnormal step, the bit
// difference is the code. Normals: integer rounding of the float32 bits, then re-biasing.
template <int M, int BIAS>
inline uint8_t encode_fp8(float y) {
  const uint32_t b = f32_bits(y);
  const uint32_t sign = (b >> 24) & 0x80u;
  const uint32_t a = b & 0x7FFFFFFFu;
  constexpr int kEmin = 1 - BIAS;
  constexpr uint32_t kMinNormal = static_cast<uint32_t>(127 + kEmin) << 23;
  constexpr uint32_t kMagic = static_cast<uint32_t>(127 + kEmin - M + 23) << 23;
  uint32_t code;
  if (a < kMinNormal) {
    code = f32_bits(bits_f32(a) + bits_f32(kMagic)) - kMagic;
  } else {
    constexpr int kShift = 23 - M;
    const uint32_t round = ((1u << (kShift - 1)) - 1) + ((a >> kShift) & 1u);
    code = (a + round - (static_cast<uint32_t>(127 - BIAS) << 23)) >> kShift;
  }
  return static_cast<uint8_t>(sign | code);
}

// Decode of an fp8 code by arithmetic (vectorisable, unlike a table lookup). A subnormal is
// decoded as the normal with exponent field 1 minus the smallest normal: exact in float32.
template <int M, int BIAS, bool FN>
inline float decode_fp8(uint32_t c) {
  constexpr uint32_t kEMask = (1u << (7 - M)) - 1;
  constexpr uint32_t kMinNormal = static_cast<uint32_t>(127 + 1 - BIAS) << 23;
  const uint32_t sign = (c & 0x80u) << 24;
  const uint32_t e = (c >> M) & kEMask;
  const uint32_t m = c & ((1u << M) - 1);
  const uint32_t e_field = e == 0 ? 1u : e;
  const float normal = bits_f32(((e_field + 127 - BIAS) << 23) | (m << (23 - M)));
  const float mag = e == 0 ? normal - bits_f32(kMinNormal) : normal;
  // e4m3fn: S.1111.111 is NaN (no infinities); e5m2: exponent all ones is inf (m == 0) or NaN.
  const bool special = FN ? (c & 0x7Fu) == 0x7Fu : e == kEMask;
  const uint32_t special_bits = (FN || m != 0) ? 0x7FC00000u : 0x7F800000u;
  return bits_f32((special ? special_bits : f32_bits(mag)) | sign);
}

}  // namespace

}  // namespace ds::quant
