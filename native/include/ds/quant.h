// Group-wise quantization kernels (CPU). The format is defined by ds.ops.quant.reference:
// every group is quantized on its own; the last group is padded with the encoding of 0.0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

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
// the weight's and the block's scales. Symmetric schemes only (int8_sym, int4_sym). Groups of a
// multiple of 32 are packed (pack_a8) for the call; a weight used many times should be packed
// once and passed to linear_a8_packed.
void linear_int_a8(const float* x, int64_t m, int64_t k, const uint8_t* data, const float* scales,
                   int64_t n, int64_t group_size, IntScheme s, float* y);

// A weight of linear_int_a8 laid out for integer dot products over 16 output rows at once: one
// 64-byte vector holds 4 code bytes of each of 16 rows, so each int32 lane of a dot-product
// instruction sums one row's products, and a group ends with one conversion, one multiply and one
// add per 16 rows instead of per row. Rows are taken 16 at a time ("tiles"; the last padded with
// codes of zero and scales of 0). Per tile and block of 32 elements, 8 (int8) or 4 (int4) such
// vectors: vector s holds, per row, elements 4s..4s+3 (int8 codes as stored), or for int4 bytes
// whose low nibbles are elements 4s..4s+3 and high nibbles 16+4s..16+4s+3 (nibbles as stored,
// zero point 8). Memory: ceil(n / 16) * 16 rows of k (int8) or k / 2 (int4) code bytes, 4 bytes
// of scale per row and group, and for int8 4 more (minus 128 times the group's code sum: the VNNI
// variants read the activations as unsigned code + 128 and take that back).
struct A8Packed {
  int bits = 0;
  int64_t n = 0, k = 0, gs = 0, tiles = 0;
  std::vector<uint8_t> codes;
  std::vector<float> scales;   // [tile][group][16 rows]
  std::vector<int32_t> corr;   // int8: [tile][group][16 rows]
  size_t bytes() const { return codes.size() + 4 * (scales.size() + corr.size()); }
};
// Whether linear_int_a8 packs weights of this group size (a multiple of 32).
inline bool a8_packs(int64_t group_size) { return group_size > 0 && group_size % 32 == 0; }
A8Packed pack_a8(const uint8_t* data, const float* scales, int64_t n, int64_t k,
                 int64_t group_size, int bits);
void linear_a8_packed(const float* x, int64_t m, const A8Packed& w, float* y);

// x[n] (n a multiple of block) to int8 codes per block: scale = max|x| / 127, code =
// round-half-even(x * (127 / max|x|)) in fp32, 0 for a block of zeros.
void quantize_activations(const float* x, int64_t n, int64_t block, int8_t* codes,
                          float* scales);

// Integer dot-product variants of linear_int_a8. Packed weights run the best one the CPU, the
// build and the SIMD level in use (ds/simd.h) allow, at most the one set by set_dot_isa; other
// group sizes run the scalar variant on the stored layout.
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
