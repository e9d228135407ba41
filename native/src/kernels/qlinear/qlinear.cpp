// Dispatch of the quantized linear layer (qlinear_impl.h): output rows split over the kernel
// pool, each range run by the variant of the SIMD level in use.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "ds/quant.h"
#include "ds/simd.h"
#include "ds/thread_pool.h"

#define DS_QLIN_DECLARE(ns)                                                                   \
  namespace ns {                                                                              \
  void qlinear_rows(const float* x, const float* xe, const float* xo, const float* xs,       \
                    int64_t r, int64_t k, const uint8_t* data, const float* scales,          \
                    const float* zps, int64_t gs, const IntScheme& s, int64_t j0, int64_t j1, \
                    float* y, int64_t ldy);                                                   \
  }

namespace ds::quant {
DS_QLIN_DECLARE(scalar)
#if defined(__x86_64__) || defined(__i386__)
DS_QLIN_DECLARE(avx2)
DS_QLIN_DECLARE(avx512)
#endif

void linear_int(const float* x, int64_t m, int64_t k, const uint8_t* data, const float* scales,
                const float* zps, int64_t n, int64_t gs, IntScheme s, float* y) {
  if (m <= 0 || n <= 0) return;
  const int64_t gpr = k / gs;
  // Per row of x: its group sums (for the zero points), and for 4 bits its even and odd
  // elements, which the low and high nibbles of each byte multiply.
  std::vector<float> xs(static_cast<size_t>(m * gpr));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t g = 0; g < gpr; ++g) {
      float sum = 0.0f;
      for (int64_t t = 0; t < gs; ++t) sum += x[i * k + g * gs + t];
      xs[i * gpr + g] = sum;
    }
  std::vector<float> xe, xo;
  if (s.bits == 4) {
    xe.resize(static_cast<size_t>(m * (k / 2)));
    xo.resize(xe.size());
    for (int64_t i = 0; i < m; ++i)
      for (int64_t t = 0; t < k / 2; ++t) {
        xe[i * (k / 2) + t] = x[i * k + 2 * t];
        xo[i * (k / 2) + t] = x[i * k + 2 * t + 1];
      }
  }
  const int level = static_cast<int>(ds::simd_level());
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, k));
  ds::parallel_for(n, grain, 1, [&](int64_t j0, int64_t j1) {
    for (int64_t i0 = 0; i0 < m; i0 += 4) {
      const int64_t r = std::min<int64_t>(4, m - i0);
      const float* xi = x + i0 * k;
      const float* xei = xe.empty() ? nullptr : xe.data() + i0 * (k / 2);
      const float* xoi = xo.empty() ? nullptr : xo.data() + i0 * (k / 2);
      const float* xsi = xs.data() + i0 * gpr;
      float* yi = y + i0 * n;
#if defined(__x86_64__) || defined(__i386__)
      if (level >= static_cast<int>(ds::SimdLevel::kAvx512)) {
        avx512::qlinear_rows(xi, xei, xoi, xsi, r, k, data, scales, zps, gs, s, j0, j1, yi, n);
        continue;
      }
      if (level >= static_cast<int>(ds::SimdLevel::kAvx2)) {
        avx2::qlinear_rows(xi, xei, xoi, xsi, r, k, data, scales, zps, gs, s, j0, j1, yi, n);
        continue;
      }
#endif
      scalar::qlinear_rows(xi, xei, xoi, xsi, r, k, data, scales, zps, gs, s, j0, j1, yi, n);
    }
  });
}

}  // namespace ds::quant
