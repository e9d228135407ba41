// linear_int_a8: the activations quantized to int8 per block of one weight group, laid out for
// the integer dot-product variant in use (qlinear_a8_impl.h), then output rows split over the
// kernel pool.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ds/quant.h"
#include "ds/simd.h"
#include "ds/thread_pool.h"
#include "qlinear_a8.h"

namespace ds::quant {
#define DS_QA8_DECLARE(ns)                                                                     \
  namespace ns {                                                                               \
  void qa8_rows(const A8Args& a, int64_t j0, int64_t j1);                                      \
  void qa8_quantize(const float* x, int64_t n, int64_t block, int8_t* codes, float* scales);   \
  }
DS_QA8_DECLARE(scalar)
#if defined(__x86_64__) || defined(__i386__)
DS_QA8_DECLARE(avx2)
DS_QA8_DECLARE(avxvnni)
DS_QA8_DECLARE(avx512vnni)
#endif

namespace {

std::atomic<int> g_dot_cap{static_cast<int>(DotIsa::kAvx512Vnni)};

bool dot_runs_here(DotIsa d) {
  if (d == DotIsa::kScalar) return true;
#if defined(__x86_64__) || defined(__i386__)
  const int level = static_cast<int>(ds::simd_level());
  __builtin_cpu_init();
  switch (d) {
    case DotIsa::kAvx2: return level >= static_cast<int>(ds::SimdLevel::kAvx2);
    case DotIsa::kAvxVnni:
      return level >= static_cast<int>(ds::SimdLevel::kAvx2) && __builtin_cpu_supports("avxvnni");
    case DotIsa::kAvx512Vnni:
      return level >= static_cast<int>(ds::SimdLevel::kAvx512) &&
             __builtin_cpu_supports("avx512vnni");
    default: return false;
  }
#else
  return false;
#endif
}

constexpr const char* kDotNames[] = {"scalar", "avx2", "avx_vnni", "avx512_vnni"};

// The variant's functions (all compute the same: integer math is exact, and the activation
// quantization rounds the same fp32 operations).
struct Variant {
  decltype(&scalar::qa8_rows) rows;
  decltype(&scalar::qa8_quantize) quantize;
};

Variant variant(DotIsa d) {
  switch (d) {
#if defined(__x86_64__) || defined(__i386__)
    case DotIsa::kAvx512Vnni:
      return {avx512vnni::qa8_rows, avx512vnni::qa8_quantize};
    case DotIsa::kAvxVnni: return {avxvnni::qa8_rows, avxvnni::qa8_quantize};
    case DotIsa::kAvx2: return {avx2::qa8_rows, avx2::qa8_quantize};
#endif
    default: return {scalar::qa8_rows, scalar::qa8_quantize};
  }
}

}  // namespace

DotIsa dot_isa() {
  for (int d = g_dot_cap.load(); d > 0; --d)
    if (dot_runs_here(static_cast<DotIsa>(d))) return static_cast<DotIsa>(d);
  return DotIsa::kScalar;
}

bool set_dot_isa(DotIsa d) {
  if (!dot_runs_here(d)) return false;
  g_dot_cap.store(static_cast<int>(d));
  return true;
}

const char* dot_isa_name(DotIsa d) { return kDotNames[static_cast<int>(d)]; }

bool parse_dot_isa(const char* name, DotIsa* out) {
  for (int d = 0; d < 4; ++d)
    if (std::strcmp(name, kDotNames[d]) == 0) {
      *out = static_cast<DotIsa>(d);
      return true;
    }
  return false;
}

const char* dot_isas_built() {
#if defined(__x86_64__) || defined(__i386__)
  return "scalar,avx2,avx_vnni,avx512_vnni";
#else
  return "scalar";
#endif
}

void quantize_activations(const float* x, int64_t n, int64_t block, int8_t* codes,
                          float* scales) {
  variant(dot_isa()).quantize(x, n, block, codes, scales);
}

void linear_int_a8(const float* x, int64_t m, int64_t k, const uint8_t* data, const float* scales,
                   int64_t n, int64_t gs, IntScheme s, float* y) {
  if (m <= 0 || n <= 0) return;
  const DotIsa isa = gs % 32 == 0 ? dot_isa() : DotIsa::kScalar;  // SIMD takes whole 32s
  const int64_t gpr = k / gs;
  const int64_t kcode = s.bits == 8 ? k : k / 2;
  const int64_t kcp = (kcode + 63) / 64 * 64;
  const int64_t lanes = kcp / 4;
  // Reused across calls (a decode step makes hundreds): zeroing fresh buffers cost more than
  // the quantization itself. Only each row's padding needs zeros.
  thread_local std::vector<int8_t> codes, xq, xo;
  thread_local std::vector<float> sa;
  thread_local std::vector<int32_t> lane_g;
  codes.resize(static_cast<size_t>(k));
  sa.resize(static_cast<size_t>(m * gpr));
  xq.resize(static_cast<size_t>(m * kcp));
  xo.resize(s.bits == 4 ? static_cast<size_t>(m * kcp) : 0);
  lane_g.resize(static_cast<size_t>(lanes));
  const int64_t per_lane = s.bits == 8 ? 4 : 8;  // elements of x a lane's 4 code bytes meet
  for (int64_t l = 0; l < lanes; ++l)  // padding lanes stay in the row's last group
    lane_g[l] = static_cast<int32_t>(std::min(l * per_lane, k - 1) / gs);
  const Variant v = variant(isa);
  for (int64_t i = 0; i < m; ++i) {
    int8_t* qe = xq.data() + i * kcp;
    if (s.bits == 8) {
      v.quantize(x + i * k, k, gs, qe, sa.data() + i * gpr);
    } else {
      v.quantize(x + i * k, k, gs, codes.data(), sa.data() + i * gpr);
      int8_t* qo = xo.data() + i * kcp;
      for (int64_t t = 0; t < kcode; ++t) {
        qe[t] = codes[2 * t];
        qo[t] = codes[2 * t + 1];
      }
      std::memset(qo + kcode, 0, static_cast<size_t>(kcp - kcode));
    }
    std::memset(qe + kcode, 0, static_cast<size_t>(kcp - kcode));
  }
  const A8Args a{s.bits, k, gs, kcode, data, data + n * kcode, scales, scales + n * gpr, m,
                 xq.data(), s.bits == 4 ? xo.data() : nullptr, kcp, lane_g.data(), sa.data(), y, n};
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, k));
  ds::parallel_for(n, grain, 1, [&](int64_t j0, int64_t j1) { v.rows(a, j0, j1); });
}

}  // namespace ds::quant
