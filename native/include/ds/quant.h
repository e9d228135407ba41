// Group-wise quantization kernels (CPU). The format is defined by ds.ops.quant.reference:
// every group is quantized on its own; the last group is padded with the encoding of 0.0.
#pragma once

#include <cstdint>

namespace ds::quant {

enum class InputType { F32, F16, BF16 };
enum class Fp8Format { E4M3, E5M2 };

struct IntScheme {
  int bits;   // 8 or 4 (two codes per byte, element 2i in the low nibble)
  bool asym;  // asymmetric: zero point per group, range widened to include 0
  int qmin;
  int qmax;
};

// x: n elements of type `in`; data: G * bytes_per_group bytes; scales, zero_points: G floats
// (zero_points only for asymmetric schemes, may be null otherwise).
void quantize_int(const void* x, InputType in, int64_t n, int64_t group_size, IntScheme s,
                  uint8_t* data, float* scales, float* zero_points);
void dequantize_int(const uint8_t* data, const float* scales, const float* zero_points,
                    int64_t n, int64_t group_size, IntScheme s, float* out);

void quantize_fp8(const void* x, InputType in, int64_t n, int64_t group_size, Fp8Format f,
                  uint8_t* data, float* scales);
void dequantize_fp8(const uint8_t* data, const float* scales, int64_t n, int64_t group_size,
                    Fp8Format f, float* out);

// y[m, n] = x[m, k] W^T for W[n, k] quantized group-wise by an integer scheme, read from its
// codes (no float copy of W). Needs k % group_size == 0, and an even group_size for 4 bits.
void linear_int(const float* x, int64_t m, int64_t k, const uint8_t* data, const float* scales,
                const float* zero_points, int64_t n, int64_t group_size, IntScheme s, float* y);

// Scalar encoders, exposed for tests of the bit-exact conversion.
uint8_t fp8_encode(float y, Fp8Format f);
float fp8_decode(uint8_t code, Fp8Format f);

}  // namespace ds::quant
