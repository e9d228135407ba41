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

// linear_int with x quantized too: each row of x to int8 per block of group_size elements
// (quantize_activations), each group's contribution an exact int32 dot product of codes scaled by
// the weight's and the block's scales. Symmetric schemes only (int8_sym, int4_sym).
void linear_int_a8(const float* x, int64_t m, int64_t k, const uint8_t* data, const float* scales,
                   int64_t n, int64_t group_size, IntScheme s, float* y);

// x[n] (n a multiple of block) to int8 codes per block: scale = max|x| / 127, code =
// round-half-even(x * (127 / max|x|)) in fp32, 0 for a block of zeros.
void quantize_activations(const float* x, int64_t n, int64_t block, int8_t* codes,
                          float* scales);

// Integer dot-product variants of linear_int_a8. Groups of a multiple of 32 run the best one
// the CPU, the build and the SIMD level in use (ds/simd.h) allow, at most the one set by
// set_dot_isa; other group sizes run the scalar variant.
enum class DotIsa : int { kScalar = 0, kAvx2 = 1, kAvxVnni = 2, kAvx512Vnni = 3 };
DotIsa dot_isa();
// Caps the variant (tests run each one); false, changing nothing, if this CPU cannot run `d`.
bool set_dot_isa(DotIsa d);
const char* dot_isa_name(DotIsa d);  // "scalar", "avx2", "avx_vnni", "avx512_vnni"
bool parse_dot_isa(const char* name, DotIsa* out);
const char* dot_isas_built();  // comma-separated

// Scalar encoders, exposed for tests of the bit-exact conversion.
uint8_t fp8_encode(float y, Fp8Format f);
float fp8_decode(uint8_t code, Fp8Format f);

}  // namespace ds::quant
