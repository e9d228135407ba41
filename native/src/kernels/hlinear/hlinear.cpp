// Dispatch of the fp16 / fp32-weight linear (hlinear_impl.h): output columns split over the
// kernel pool, each range run by the variant of the SIMD level in use.
#include "ds/hlinear.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ds/simd.h"
#include "ds/thread_pool.h"
#include "hlinear_variants.h"

namespace ds::hlinear {

namespace {

using RowsFn = void (*)(const Args&, int64_t, int64_t);
using ToFloatFn = void (*)(const uint16_t*, int64_t, float*);

struct Variant {
  RowsFn rows;
  ToFloatFn to_float;
};

Variant variant() {
#if defined(__x86_64__) || defined(__i386__)
  const int level = static_cast<int>(ds::simd_level());
  if (level >= static_cast<int>(ds::SimdLevel::kAvx512)) return {avx512::rows, avx512::to_float};
  if (level >= static_cast<int>(ds::SimdLevel::kAvx2)) return {avx2::rows, avx2::to_float};
#endif
  return {scalar::rows, scalar::to_float};
}

}  // namespace

void linear(const void* x, bool x_half, int64_t m, int64_t k, const void* w, bool w_half,
            int64_t n, const void* bias, bool bias_half, void* y) {
  if (m <= 0 || n <= 0) return;
  const Variant v = variant();
  // fp16 x is converted once here (m * k elements, a few microseconds at most), not per tile.
  std::vector<float> xf;
  const float* xp = static_cast<const float*>(x);
  if (x_half) {
    xf.resize(static_cast<size_t>(m * k));
    v.to_float(static_cast<const uint16_t*>(x), m * k, xf.data());
    xp = xf.data();
  }
  const Args a{xp, m, k, w, w_half, n, bias, bias_half, y, x_half};
  // At least 32 KB of weight per slice: a thread's share of a small layer is not worth waking it.
  const int64_t bytes = w_half ? 2 : 4;
  const int64_t grain =
      std::max<int64_t>(1, (int64_t{1} << 15) / (bytes * std::max<int64_t>(1, k)));
  ds::parallel_for(n, grain, 1, [&](int64_t j0, int64_t j1) { v.rows(a, j0, j1); });
}

}  // namespace ds::hlinear
