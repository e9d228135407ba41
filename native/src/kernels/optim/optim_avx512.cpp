// AVX-512 (F/BW/VL/DQ) variant of the optimizer kernels (16 fp32 lanes). Compiled with those
// flags only for this file; chosen at run time when the CPU and OS support them.
#include <immintrin.h>

#include <cstdint>

#include "variants.h"

namespace ds {
namespace optim {
namespace avx512 {

struct V {
  using reg = __m512;
  static constexpr int W = 16;
  static reg set1(float x) { return _mm512_set1_ps(x); }
  static reg load_f32(const float* p) { return _mm512_loadu_ps(p); }
  static reg load_bf16(const uint16_t* p) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static reg load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void store_f32(float* p, reg v) { _mm512_storeu_ps(p, v); }
  static void store_bf16(uint16_t* p, reg v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb));
    r = _mm512_srli_epi32(r, 16);
    // NaN stays a (quiet) NaN instead of rounding into infinity.
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    __m512i qnan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    r = _mm512_mask_blend_epi32(nan, r, qnan);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
  }
  static void store_f16(uint16_t* p, reg v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  static reg div(reg a, reg b) { return _mm512_div_ps(a, b); }
  static reg sqrt(reg a) { return _mm512_sqrt_ps(a); }
  // 14-bit estimates + one Newton step (~23 bits). x >= 0 for sqrt.
  static reg fast_rcp(reg x) {
    reg r = _mm512_rcp14_ps(x);
    return _mm512_mul_ps(r, _mm512_fnmadd_ps(x, r, _mm512_set1_ps(2.f)));
  }
  static reg fast_sqrt(reg x) {
    reg y = _mm512_rsqrt14_ps(x);
    reg xy = _mm512_mul_ps(x, y);  // ~sqrt(x)
    // Newton: sqrt ~= xy * (1.5 - 0.5 * xy * y)
    reg s = _mm512_mul_ps(xy, _mm512_fnmadd_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), xy), y,
                                               _mm512_set1_ps(1.5f)));
    // Below the smallest normal float the estimate is unreliable; such x give 0 (absolute error
    // under 1.1e-19, far below any eps the update adds to it).
    __mmask16 normal = _mm512_cmp_ps_mask(x, _mm512_set1_ps(1.17549435e-38f), _CMP_GE_OQ);
    return _mm512_maskz_mov_ps(normal, s);
  }
  static reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static reg sign(reg a) {
    reg s = _mm512_or_ps(_mm512_and_ps(a, _mm512_set1_ps(-0.f)), _mm512_set1_ps(1.f));
    __mmask16 nonzero = _mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_NEQ_OQ);
    return _mm512_mask_blend_ps(nonzero, a, s);  // 0 and NaN pass through
  }
};

#include "kernels_impl.h"

}  // namespace avx512
}  // namespace optim
}  // namespace ds
