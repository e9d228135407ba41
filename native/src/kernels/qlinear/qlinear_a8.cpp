// linear_int_a8: the activations quantized to int8 per block of one weight group, in the form
// the integer dot-product variant in use reads (qlinear_a8_impl.h), then the packed weight's
// 16-row tiles (or, for other group sizes, output rows) split over the kernel pool.
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
  void qa8_packed(const A8Packed& w, const A8Act& a, int64_t t0, int64_t t1);                  \
  void qa8_quantize(const float* x, int64_t n, int64_t block, int8_t* codes, float* scales);   \
  void qa8_prep(const float* x, int64_t m, int64_t k, int64_t gs, int bits, int8_t* xq,        \
                float* sa, int32_t* xs);                                                       \
  }
DS_QA8_DECLARE(scalar)
namespace scalar {
void qa8_rows(const A8Rows& w, const A8Act& a, int64_t j0, int64_t j1);
}
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
  decltype(&scalar::qa8_packed) packed;
  decltype(&scalar::qa8_quantize) quantize;
  decltype(&scalar::qa8_prep) prep;
};

Variant variant(DotIsa d) {
  switch (d) {
#if defined(__x86_64__) || defined(__i386__)
    case DotIsa::kAvx512Vnni:
      return {avx512vnni::qa8_packed, avx512vnni::qa8_quantize, avx512vnni::qa8_prep};
    case DotIsa::kAvxVnni: return {avxvnni::qa8_packed, avxvnni::qa8_quantize, avxvnni::qa8_prep};
    case DotIsa::kAvx2: return {avx2::qa8_packed, avx2::qa8_quantize, avx2::qa8_prep};
#endif
    default: return {scalar::qa8_packed, scalar::qa8_quantize, scalar::qa8_prep};
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

namespace {

// Reused across calls (a decode step makes hundreds): fresh buffers cost more than the
// quantization itself.
struct ActBuffers {
  std::vector<int8_t> xq;
  std::vector<float> sa;
  std::vector<int32_t> xs;
};

A8Act prepare(const Variant& v, const float* x, int64_t m, int64_t k, int64_t gs, int bits,
              float* y, int64_t ldy) {
  thread_local ActBuffers b;
  const int64_t gpr = k / gs;
  b.xq.resize(static_cast<size_t>(m * k));
  b.sa.resize(static_cast<size_t>(m * gpr));
  b.xs.resize(static_cast<size_t>(m * gpr));
  v.prep(x, m, k, gs, bits, b.xq.data(), b.sa.data(), b.xs.data());
  return {m, b.xq.data(), b.sa.data(), b.xs.data(), y, ldy};
}

}  // namespace

void linear_a8_packed(const float* x, int64_t m, const A8Packed& w, float* y) {
  if (m <= 0 || w.n <= 0) return;
  const Variant v = variant(dot_isa());
  const A8Act a = prepare(v, x, m, w.k, w.gs, w.bits, y, w.n);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 11) / w.k);
  ds::parallel_for(w.tiles, grain, 1, [&](int64_t t0, int64_t t1) { v.packed(w, a, t0, t1); });
}

void linear_int_a8(const float* x, int64_t m, int64_t k, const uint8_t* data, const float* scales,
                   int64_t n, int64_t gs, IntScheme s, float* y) {
  if (m <= 0 || n <= 0) return;
  if (a8_packs(gs)) return linear_a8_packed(x, m, pack_a8(data, scales, n, k, gs, s.bits), y);
  const A8Act a = prepare(variant(DotIsa::kScalar), x, m, k, gs, s.bits, y, n);
  const A8Rows w{s.bits, k, gs, s.bits == 8 ? k : k / 2, data, scales};
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / k);
  ds::parallel_for(n, grain, 1, [&](int64_t j0, int64_t j1) { scalar::qa8_rows(w, a, j0, j1); });
}

}  // namespace ds::quant
