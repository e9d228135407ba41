// What the dispatch of linear_int_a8 (qlinear_a8.cpp) hands each ISA variant
// (qlinear_a8_impl.h): the activations already quantized, in the layouts the variants read.
#pragma once

#include <cstdint>

namespace ds::quant {

struct A8Args {
  int bits;            // 8 or 4 (int8_sym codes as signed bytes; int4_sym as nibbles around 8)
  int64_t k, gs;       // elements per row, per group (an activation block is one group)
  int64_t kcode;       // code bytes per weight row: k (8 bits) or k / 2 (4 bits)
  const uint8_t* data;  // n rows of kcode code bytes
  const uint8_t* data_end;
  const float* scales;  // n rows of k / gs
  const float* scales_end;
  int64_t m;           // rows of x
  // Per row of x, kcp bytes (kcode rounded up to 64, the padding zero): the activation codes,
  // for 4 bits those of the even elements in xq and of the odd ones in xo (a byte's low nibble
  // meets the even element, its high nibble the odd one).
  const int8_t* xq;
  const int8_t* xo;
  int64_t kcp;
  // Per lane (the 4 code bytes one int32 lane of a dot product meets; kcp / 4 a row), the
  // group of a weight row it falls in.
  const int32_t* lane_g;
  const float* sa;  // per row of x, its k / gs activation scales
  float* y;
  int64_t ldy;
};

}  // namespace ds::quant
