#include "ds/simd.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace ds {
namespace {

SimdLevel probe() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // libgcc's probe also checks that the OS saves the wider register state (XCR0).
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return __builtin_cpu_supports("avx512bf16") ? SimdLevel::kAvx512Bf16 : SimdLevel::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c"))
    return SimdLevel::kAvx2;
  return SimdLevel::kScalar;
#elif defined(__aarch64__) && defined(DS_HAVE_NEON)
  return SimdLevel::kNeon;
#else
  return SimdLevel::kScalar;
#endif
}

bool level_runs_here(SimdLevel level) {
  if (level == SimdLevel::kScalar) return true;
#if defined(__x86_64__) || defined(__i386__)
  if (level == SimdLevel::kNeon) return false;
#else
  if (level == SimdLevel::kAvx2 || level == SimdLevel::kAvx512 || level == SimdLevel::kAvx512Bf16)
    return false;
#endif
  return static_cast<int>(level) <= static_cast<int>(detected_simd_level());
}

std::atomic<int> g_level{-1};

}  // namespace

SimdLevel detected_simd_level() {
  static const SimdLevel detected = probe();
  return detected;
}

SimdLevel simd_level() {
  int v = g_level.load(std::memory_order_relaxed);
  if (v >= 0) return static_cast<SimdLevel>(v);
  SimdLevel level = detected_simd_level();
  const char* env = std::getenv("DS_SIMD");
  SimdLevel wanted;
  if (env && *env && parse_simd_level(env, &wanted) && level_runs_here(wanted)) level = wanted;
  int expected = -1;
  g_level.compare_exchange_strong(expected, static_cast<int>(level));
  return static_cast<SimdLevel>(g_level.load());
}

bool set_simd_level(SimdLevel level) {
  if (!level_runs_here(level)) return false;
  g_level.store(static_cast<int>(level));
  return true;
}

const char* simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar: return "scalar";
    case SimdLevel::kNeon: return "neon";
    case SimdLevel::kAvx2: return "avx2";
    case SimdLevel::kAvx512: return "avx512";
    case SimdLevel::kAvx512Bf16: return "avx512_bf16";
  }
  return "unknown";
}

bool parse_simd_level(const char* name, SimdLevel* out) {
  const SimdLevel all[] = {SimdLevel::kScalar, SimdLevel::kNeon, SimdLevel::kAvx2,
                           SimdLevel::kAvx512, SimdLevel::kAvx512Bf16};
  for (SimdLevel l : all) {
    if (std::strcmp(name, simd_level_name(l)) == 0) {
      *out = l;
      return true;
    }
  }
  return false;
}

const char* simd_levels_built() {
#if defined(__x86_64__) || defined(__i386__)
  return "scalar,avx2,avx512,avx512_bf16";
#elif defined(__aarch64__) && defined(DS_HAVE_NEON)
  return "scalar,neon";
#else
  return "scalar";
#endif
}

}  // namespace ds
