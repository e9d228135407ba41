// NEON (AArch64 Advanced SIMD) variant of the optimizer kernels: two 4-lane fp32 registers per
// step (8 lanes), so each iteration holds two independent dependency chains. Built only for
// aarch64, where NEON is part of the baseline ISA (no extra flags); chosen when the build is an
// aarch64 one (every aarch64 CPU has NEON).
//
// AArch64 has correctly rounded vector sqrt and division, so fast_sqrt / fast_div use them too:
// the bf16/fp16 results equal the scalar variant's up to the fp32 rounding of the rearranged
// moment formulas (see kernels_impl.h). native/tests/neon_check.cpp compares this variant with
// the scalar one under qemu-aarch64.
#include <arm_neon.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "variants.h"

namespace ds {
namespace optim {
namespace neon {

struct V {
  struct reg {
    float32x4_t a, b;  // lanes 0-3 and 4-7
  };
  static constexpr int W = 8;

  static reg set1(float x) { return {vdupq_n_f32(x), vdupq_n_f32(x)}; }
  static reg load_f32(const float* p) { return {vld1q_f32(p), vld1q_f32(p + 4)}; }
  static reg load_bf16(const uint16_t* p) {
    // A bf16 value shifted into the high half of a 32-bit lane is its fp32 value.
    const uint16x8_t h = vld1q_u16(p);
    return {vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16)),
            vreinterpretq_f32_u32(vshll_high_n_u16(h, 16))};
  }
  static reg load_f16(const uint16_t* p) {
    const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(p));
    return {vcvt_f32_f16(vget_low_f16(h)), vcvt_high_f32_f16(h)};
  }
  static void store_f32(float* p, reg v) {
    vst1q_f32(p, v.a);
    vst1q_f32(p + 4, v.b);
  }
  // Round to nearest even on the 32-bit pattern, then keep the high halves; a NaN keeps its
  // payload with the quiet bit set instead of rounding into infinity.
  static uint16x4_t bf16_bits(float32x4_t v) {
    const uint32x4_t u = vreinterpretq_u32_f32(v);
    const uint32x4_t lsb = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
    const uint32x4_t rounded = vaddq_u32(u, vaddq_u32(vdupq_n_u32(0x7FFF), lsb));
    const uint32x4_t quiet = vorrq_u32(u, vdupq_n_u32(0x00400000));
    const uint32x4_t is_num = vceqq_f32(v, v);
    return vshrn_n_u32(vbslq_u32(is_num, rounded, quiet), 16);
  }
  static void store_bf16(uint16_t* p, reg v) {
    vst1q_u16(p, vcombine_u16(bf16_bits(v.a), bf16_bits(v.b)));
  }
  static void store_f16(uint16_t* p, reg v) {
    // FCVTN rounds per FPCR: Linux runs user code with round-to-nearest-even and no flushing.
    vst1q_u16(p, vreinterpretq_u16_f16(vcvt_high_f16_f32(vcvt_f16_f32(v.a), v.b)));
  }

  static reg add(reg x, reg y) { return {vaddq_f32(x.a, y.a), vaddq_f32(x.b, y.b)}; }
  static reg sub(reg x, reg y) { return {vsubq_f32(x.a, y.a), vsubq_f32(x.b, y.b)}; }
  static reg mul(reg x, reg y) { return {vmulq_f32(x.a, y.a), vmulq_f32(x.b, y.b)}; }
  static reg div(reg x, reg y) { return {vdivq_f32(x.a, y.a), vdivq_f32(x.b, y.b)}; }
  static reg sqrt(reg x) { return {vsqrtq_f32(x.a), vsqrtq_f32(x.b)}; }
  static reg fast_sqrt(reg x) { return sqrt(x); }
  static reg fast_div(reg x, reg y) { return div(x, y); }
  // x * y + z, one rounding
  static reg rough_sqrt(reg x) { return sqrt(x); }
  static reg rough_div(reg x, reg y) { return div(x, y); }
  static reg fma(reg x, reg y, reg z) { return {vfmaq_f32(z.a, x.a, y.a), vfmaq_f32(z.b, x.b, y.b)}; }
  // x * y - z, one rounding (negation is exact)
  static reg fmsub(reg x, reg y, reg z) {
    return {vnegq_f32(vfmsq_f32(z.a, x.a, y.a)), vnegq_f32(vfmsq_f32(z.b, x.b, y.b))};
  }
  static float32x4_t sign1(float32x4_t a) {
    const uint32x4_t sign_bit = vandq_u32(vreinterpretq_u32_f32(a), vdupq_n_u32(0x80000000u));
    const float32x4_t s = vreinterpretq_f32_u32(vorrq_u32(sign_bit, vdupq_n_u32(0x3F800000u)));
    // Ordered comparisons: false for 0 and NaN, which pass through unchanged.
    const uint32x4_t nonzero = vorrq_u32(vcgtzq_f32(a), vcltzq_f32(a));
    return vbslq_f32(nonzero, s, a);
  }
  static reg sign(reg a) { return {sign1(a.a), sign1(a.b)}; }
};

#include "kernels_impl.h"

}  // namespace neon
}  // namespace optim
}  // namespace ds
