// Dispatch of the quantization kernels: groups split over the kernel pool, each range run by the
// variant of the SIMD level in use (ds/simd.h).
#include <cstdint>

#include "ds/quant.h"
#include "ds/simd.h"
#include "parallel.h"
#include "variants.h"

namespace ds::quant {

namespace {

int64_t groups_of(int64_t n, int64_t gs) { return (n + gs - 1) / gs; }

// Calls `fn` of the namespace matching the current SIMD level.
#if defined(__x86_64__) || defined(__i386__)
#define DS_QUANT_DISPATCH(fn, ...)                  \
  switch (ds::simd_level()) {                       \
    case ds::SimdLevel::kAvx512Bf16:                \
    case ds::SimdLevel::kAvx512:                    \
      avx512::fn(__VA_ARGS__);                      \
      break;                                        \
    case ds::SimdLevel::kAvx2:                      \
      avx2::fn(__VA_ARGS__);                        \
      break;                                        \
    default:                                        \
      scalar::fn(__VA_ARGS__);                      \
  }
#else
#define DS_QUANT_DISPATCH(fn, ...) scalar::fn(__VA_ARGS__);
#endif

}  // namespace

void quantize_int(const void* x, InputType in, int64_t n, int64_t gs, IntScheme s,
                  uint8_t* data, float* scales, float* zps) {
  for_group_ranges(groups_of(n, gs), gs, [&](int64_t g0, int64_t g1) {
    DS_QUANT_DISPATCH(quantize_int_groups, x, in, n, gs, s, data, scales, zps, g0, g1)
  });
}

void quantize_fp8(const void* x, InputType in, int64_t n, int64_t gs, Fp8Format f,
                  uint8_t* data, float* scales) {
  for_group_ranges(groups_of(n, gs), gs, [&](int64_t g0, int64_t g1) {
    DS_QUANT_DISPATCH(quantize_fp8_groups, x, in, n, gs, f, data, scales, g0, g1)
  });
}

void dequantize_int(const uint8_t* data, const float* scales, const float* zps, int64_t n,
                    int64_t gs, IntScheme s, float* out) {
  for_group_ranges(groups_of(n, gs), gs, [&](int64_t g0, int64_t g1) {
    DS_QUANT_DISPATCH(dequantize_int_groups, data, scales, zps, n, gs, s, out, g0, g1)
  });
}

void dequantize_fp8(const uint8_t* data, const float* scales, int64_t n, int64_t gs,
                    Fp8Format f, float* out) {
  for_group_ranges(groups_of(n, gs), gs, [&](int64_t g0, int64_t g1) {
    DS_QUANT_DISPATCH(dequantize_fp8_groups, data, scales, n, gs, f, out, g0, g1)
  });
}

}  // namespace ds::quant
