// AVX2 + FMA + F16C variant of the optimizer kernels (8 fp32 lanes). Compiled with those flags
// only for this file; chosen at run time when the CPU has them.
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "variants.h"

namespace ds {
namespace optim {
namespace avx2 {

struct V {
  using reg = __m256;
  static constexpr int W = 8;
  static reg set1(float x) { return _mm256_set1_ps(x); }
  static reg load_f32(const float* p) { return _mm256_loadu_ps(p); }
  static reg load_bf16(const uint16_t* p) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static reg load_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void store_f32(float* p, reg v) { _mm256_storeu_ps(p, v); }
  static void store_bf16(uint16_t* p, reg v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb));
    r = _mm256_srli_epi32(r, 16);
    // NaN stays a (quiet) NaN instead of rounding into infinity.
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    r = _mm256_blendv_epi8(r, qnan, nan);
    __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
  static void store_f16(uint16_t* p, reg v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm256_sub_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  static reg div(reg a, reg b) { return _mm256_div_ps(a, b); }
  static reg sqrt(reg a) { return _mm256_sqrt_ps(a); }
  // a / b from the 12-bit reciprocal estimate r and one Newton step on the quotient:
  // q = a*r + r*(a - b*a*r) (about 2^-21 relative).
  static reg fast_div(reg a, reg b) {
    reg r = _mm256_rcp_ps(b);
    reg q = _mm256_mul_ps(a, r);
    return _mm256_fmadd_ps(r, _mm256_fnmadd_ps(b, q, a), q);
  }
  // 12-bit estimate + one Newton step (~22 bits). x >= 0.
  static reg fast_sqrt(reg x) {
    reg y = _mm256_rsqrt_ps(x);
    reg xy = _mm256_mul_ps(x, y);  // ~sqrt(x)
    // Newton: sqrt ~= xy * (1.5 - 0.5 * xy * y)
    reg s = _mm256_mul_ps(xy, _mm256_fnmadd_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), xy), y,
                                               _mm256_set1_ps(1.5f)));
    // Below the smallest normal float the estimate is unreliable; such x give 0 (absolute error
    // under 1.1e-19, far below any eps the update adds to it).
    return _mm256_and_ps(s, _mm256_cmp_ps(x, _mm256_set1_ps(1.17549435e-38f), _CMP_GE_OQ));
  }
  static reg rough_sqrt(reg x) { return fast_sqrt(x); }  // 12-bit estimate: keep the Newton step
  static reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static reg fmsub(reg a, reg b, reg c) { return _mm256_fmsub_ps(a, b, c); }
  static reg sign(reg a) {
    const reg zero = _mm256_setzero_ps();
    reg s = _mm256_or_ps(_mm256_and_ps(a, _mm256_set1_ps(-0.f)), _mm256_set1_ps(1.f));
    return _mm256_blendv_ps(a, s, _mm256_cmp_ps(a, zero, _CMP_NEQ_OQ));  // 0 and NaN pass through
  }
};

#include "kernels_impl.h"

}  // namespace avx2
}  // namespace optim
}  // namespace ds
