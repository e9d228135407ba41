// float32 <-> fp8 (e4m3fn, e5m2) conversion with round-half-to-even, bit-exact with
// torch's Tensor.to(float8_*) for finite inputs within range (callers clamp first).
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "ds/quant.h"
#include "fp8_impl.h"

namespace ds::quant {

namespace {

template <int M, int BIAS, bool FN>
std::array<float, 256> make_table() {
  std::array<float, 256> t{};
  constexpr int emask = (1 << (7 - M)) - 1;
  for (int c = 0; c < 256; ++c) {
    const int e = (c >> M) & emask;
    const int mant = c & ((1 << M) - 1);
    float v;
    if (e == 0) {
      v = std::ldexp(static_cast<float>(mant), 1 - BIAS - M);
    } else if (FN && e == emask && mant == (1 << M) - 1) {
      v = NAN;  // e4m3fn has no infinities; S.1111.111 is NaN
    } else if (!FN && e == emask) {
      v = mant == 0 ? INFINITY : NAN;
    } else {
      v = std::ldexp(1.0f + static_cast<float>(mant) / (1 << M), e - BIAS);
    }
    t[c] = (c & 0x80) ? -v : v;
  }
  return t;
}

const std::array<float, 256> kE4M3 = make_table<3, 7, true>();
const std::array<float, 256> kE5M2 = make_table<2, 15, false>();

}  // namespace

const float* fp8_table(Fp8Format f) { return f == Fp8Format::E4M3 ? kE4M3.data() : kE5M2.data(); }

uint8_t fp8_encode(float y, Fp8Format f) {
  return f == Fp8Format::E4M3 ? encode_fp8<3, 7>(y) : encode_fp8<2, 15>(y);
}

float fp8_decode(uint8_t code, Fp8Format f) { return fp8_table(f)[code]; }

}  // namespace ds::quant
