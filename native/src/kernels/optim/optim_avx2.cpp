// AVX2 + FMA + F16C variant of the optimizer kernels: two 8-lane fp32 registers per step (16
// lanes), for the same reasons as vec_avx512.h. Compiled with those flags only for this file;
// chosen at run time when the CPU has them and lacks AVX-512.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "variants.h"

namespace ds {
namespace optim {
namespace avx2 {

struct V {
  struct reg {
    __m256 a, b;  // lanes 0-7 and 8-15
  };
  static constexpr int W = 16;

  static reg set1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
  static reg load_f32(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static __m256 bf16x8(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static reg load_bf16(const uint16_t* p) { return {bf16x8(p), bf16x8(p + 8)}; }
  static reg load_f16(const uint16_t* p) {
    return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
  }
  static void store_f32(float* p, reg v) {
    _mm256_storeu_ps(p, v.a);
    _mm256_storeu_ps(p + 8, v.b);
  }
  // Round to nearest even on the 32-bit pattern; a NaN instead gets its quiet bit set (so it
  // cannot round into infinity). Returns the bf16 value in the low half of each lane.
  static __m256i bf16_round(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
    const __m256 quiet = _mm256_castsi256_ps(_mm256_or_si256(u, _mm256_set1_epi32(0x00400000)));
    const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    const __m256 picked = _mm256_blendv_ps(_mm256_castsi256_ps(r), quiet, nan);
    return _mm256_srli_epi32(_mm256_castps_si256(picked), 16);
  }
  static void store_bf16(uint16_t* p, reg v) {
    // packus works within 128-bit halves: [a0-3 b0-3 | a4-7 b4-7]; the permute restores order.
    const __m256i packed = _mm256_packus_epi32(bf16_round(v.a), bf16_round(v.b));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_permute4x64_epi64(packed, 0xD8));
  }
  static void store_f16(uint16_t* p, reg v) {
    constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v.a, kRound));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 8), _mm256_cvtps_ph(v.b, kRound));
  }

  static reg add(reg x, reg y) { return {_mm256_add_ps(x.a, y.a), _mm256_add_ps(x.b, y.b)}; }
  static reg sub(reg x, reg y) { return {_mm256_sub_ps(x.a, y.a), _mm256_sub_ps(x.b, y.b)}; }
  static reg mul(reg x, reg y) { return {_mm256_mul_ps(x.a, y.a), _mm256_mul_ps(x.b, y.b)}; }
  static reg div(reg x, reg y) { return {_mm256_div_ps(x.a, y.a), _mm256_div_ps(x.b, y.b)}; }
  static reg sqrt(reg x) { return {_mm256_sqrt_ps(x.a), _mm256_sqrt_ps(x.b)}; }
  static reg fma(reg x, reg y, reg z) {
    return {_mm256_fmadd_ps(x.a, y.a, z.a), _mm256_fmadd_ps(x.b, y.b, z.b)};
  }
  // x * y - z
  static reg fmsub(reg x, reg y, reg z) {
    return {_mm256_fmsub_ps(x.a, y.a, z.a), _mm256_fmsub_ps(x.b, y.b, z.b)};
  }
  // a / b from the 12-bit reciprocal estimate r and one Newton step on the quotient:
  // q = a*r + r*(a - b*a*r) (about 2^-21 relative).
  static __m256 fast_div1(__m256 a, __m256 b) {
    const __m256 r = _mm256_rcp_ps(b);
    const __m256 q = _mm256_mul_ps(a, r);
    return _mm256_fmadd_ps(r, _mm256_fnmadd_ps(b, q, a), q);
  }
  static reg fast_div(reg a, reg b) { return {fast_div1(a.a, b.a), fast_div1(a.b, b.b)}; }
  // sqrt(x), x >= 0: 12-bit reciprocal square root estimate and one Newton step (~22 bits).
  // Below the smallest normal float the estimate is unreliable; such x give 0 (absolute error
  // under 1.1e-19, far below any eps the update adds to it).
  static __m256 fast_sqrt1(__m256 x) {
    const __m256 y = _mm256_rsqrt_ps(x);
    const __m256 xy = _mm256_mul_ps(x, y);
    const __m256 s = _mm256_mul_ps(
        xy, _mm256_fnmadd_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), xy), y, _mm256_set1_ps(1.5f)));
    return _mm256_and_ps(s, _mm256_cmp_ps(x, _mm256_set1_ps(1.17549435e-38f), _CMP_GE_OQ));
  }
  static reg fast_sqrt(reg x) { return {fast_sqrt1(x.a), fast_sqrt1(x.b)}; }
  static reg rough_sqrt(reg x) { return fast_sqrt(x); }  // 12-bit estimate: keep the Newton step
  static reg rough_div(reg a, reg b) { return fast_div(a, b); }  // likewise
  static __m256 sign1(__m256 a) {
    const __m256 s = _mm256_or_ps(_mm256_and_ps(a, _mm256_set1_ps(-0.f)), _mm256_set1_ps(1.f));
    // 0 and NaN pass through
    return _mm256_blendv_ps(a, s, _mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_NEQ_OQ));
  }
  static reg sign(reg a) { return {sign1(a.a), sign1(a.b)}; }
};

#include "kernels_impl.h"

}  // namespace avx2
}  // namespace optim
}  // namespace ds
