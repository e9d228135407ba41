// pack_a8: a weight of linear_int_a8 in the 16-row layout its dot-product variants read (the
// layout is described with A8Packed in ds/quant.h). Made once per weight; plain loops.
#include <cstdint>

#include "ds/quant.h"

namespace ds::quant {

namespace {

constexpr int64_t kRows = 16;

// Element e of row j: its signed int8 code, or its int4 nibble (zero point 8, element 2i in the
// low nibble of byte i).
inline int code8(const uint8_t* data, int64_t k, int64_t j, int64_t e) {
  return static_cast<int8_t>(data[j * k + e]);
}
inline int nibble(const uint8_t* data, int64_t k, int64_t j, int64_t e) {
  const uint8_t b = data[j * (k / 2) + e / 2];
  return e % 2 ? b >> 4 : b & 0xF;
}

}  // namespace

A8Packed pack_a8(const uint8_t* data, const float* scales, int64_t n, int64_t k, int64_t gs,
                 int bits) {
  A8Packed p;
  p.bits = bits;
  p.n = n;
  p.k = k;
  p.gs = gs;
  p.tiles = (n + kRows - 1) / kRows;
  const int64_t gpr = k / gs, blocks = k / 32;
  const int64_t subs = bits == 8 ? 8 : 4;  // 64-byte vectors per tile and block
  p.codes.assign(static_cast<size_t>(p.tiles * blocks * subs * 64), bits == 8 ? 0 : 0x88);
  p.scales.assign(static_cast<size_t>(p.tiles * gpr * kRows), 0.0f);
  if (bits == 8) p.corr.assign(p.scales.size(), 0);
  for (int64_t j = 0; j < n; ++j) {
    const int64_t t = j / kRows, r = j % kRows;
    for (int64_t g = 0; g < gpr; ++g) {
      p.scales[(t * gpr + g) * kRows + r] = scales[j * gpr + g];
      if (bits == 8) {
        int32_t sum = 0;
        for (int64_t e = g * gs; e < (g + 1) * gs; ++e) sum += code8(data, k, j, e);
        p.corr[(t * gpr + g) * kRows + r] = -128 * sum;
      }
    }
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t s = 0; s < subs; ++s)
        for (int64_t i = 0; i < 4; ++i) {
          uint8_t* out = &p.codes[((t * blocks + b) * subs + s) * 64 + r * 4 + i];
          const int64_t e = b * 32 + 4 * s + i;
          if (bits == 8) {
            *out = static_cast<uint8_t>(code8(data, k, j, e));
          } else {
            *out = static_cast<uint8_t>(nibble(data, k, j, e) | nibble(data, k, j, e + 16) << 4);
          }
        }
  }
  return p;
}

}  // namespace ds::quant
