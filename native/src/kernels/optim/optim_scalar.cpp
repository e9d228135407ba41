// Scalar variant of the optimizer kernels (any CPU; the compiler may still vectorise it for the
// baseline ISA).
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "half.h"
#include "variants.h"

namespace ds {
namespace optim {
namespace scalar {

struct V {
  using reg = float;
  static constexpr int W = 1;
  static reg set1(float x) { return x; }
  static reg load_f32(const float* p) { return *p; }
  static reg load_bf16(const uint16_t* p) { return bf16_to_f32(*p); }
  static reg load_f16(const uint16_t* p) { return f16_to_f32(*p); }
  static void store_f32(float* p, reg v) { *p = v; }
  static void store_bf16(uint16_t* p, reg v) { *p = f32_to_bf16(v); }
  static void store_f16(uint16_t* p, reg v) { *p = f32_to_f16(v); }
  static reg add(reg a, reg b) { return a + b; }
  static reg sub(reg a, reg b) { return a - b; }
  static reg mul(reg a, reg b) { return a * b; }
  static reg div(reg a, reg b) { return a / b; }
  static reg sqrt(reg a) { return std::sqrt(a); }
  static reg fast_sqrt(reg a) { return std::sqrt(a); }
  static reg fast_div(reg a, reg b) { return a / b; }
  static reg rough_sqrt(reg a) { return std::sqrt(a); }
  static reg rough_div(reg a, reg b) { return a / b; }
  // Fused where the target has a fused multiply-add instruction (aarch64; not baseline x86-64,
  // where a library fmaf would be slow), so there the scalar and vector variants round alike.
#if defined(__FP_FAST_FMAF)
  static reg fma(reg a, reg b, reg c) { return __builtin_fmaf(a, b, c); }
  static reg fmsub(reg a, reg b, reg c) { return __builtin_fmaf(a, b, -c); }
#else
  static reg fma(reg a, reg b, reg c) { return a * b + c; }
  static reg fmsub(reg a, reg b, reg c) { return a * b - c; }
#endif
  static reg sign(reg a) { return a > 0.f ? 1.f : (a < 0.f ? -1.f : a); }
};

#include "kernels_impl.h"

}  // namespace scalar
}  // namespace optim
}  // namespace ds
