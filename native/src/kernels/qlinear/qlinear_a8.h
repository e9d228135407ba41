// What the dispatch of linear_int_a8 (qlinear_a8.cpp) hands each ISA variant
// (qlinear_a8_impl.h): the activations already quantized, in the form the variant reads.
#pragma once

#include <cstdint>

#include "ds/quant.h"

namespace ds::quant {

// The activations of one call: per row of x its k int8 codes in order, its k / gs scales and,
// for 4-bit weights, minus the zero point 8 times each block's code sum.
struct A8Act {
  int64_t m;
  const int8_t* xq;   // m x k; on the VNNI variants for 8-bit weights code + 128 (unsigned)
  const float* sa;    // m x k / gs
  const int32_t* xs;  // m x k / gs (4 bits only)
  float* y;
  int64_t ldy;
};

// The weight in its stored layout (groups of a size no SIMD variant takes; scalar only).
struct A8Rows {
  int bits;
  int64_t k, gs, kcode;  // kcode: code bytes per row, k or k / 2
  const uint8_t* data;
  const float* scales;
};

}  // namespace ds::quant
