// Element loaders for the quantizer inputs (float32, float16, bfloat16 storage).
#pragma once

#include <cstdint>

#include "fp8_impl.h"

namespace ds::quant {
namespace {  // internal linkage per ISA variant (see fp8_impl.h)

struct LoadF32 {
  using T = float;
  static float load(float v) { return v; }
};

struct LoadBF16 {
  using T = uint16_t;
  static float load(uint16_t v) { return bits_f32(static_cast<uint32_t>(v) << 16); }
};

struct LoadF16 {
  using T = uint16_t;
  // Exact IEEE half -> float: normals re-biased, subnormals scaled by 2^-24, inf/NaN kept.
  static float load(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1Fu;
    const uint32_t m = h & 0x3FFu;
    float mag;
    if (e == 0) {
      mag = static_cast<float>(m) * 5.9604644775390625e-08f;  // 2^-24
    } else if (e == 31) {
      mag = bits_f32(0x7F800000u | (m << 13));
    } else {
      mag = bits_f32(((e + 112u) << 23) | (m << 13));
    }
    return bits_f32(f32_bits(mag) | sign);
  }
};

}  // namespace
}  // namespace ds::quant
