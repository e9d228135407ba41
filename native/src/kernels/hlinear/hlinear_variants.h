// What each ISA variant of the fp16 / fp32-weight linear (hlinear_impl.h) defines, for the
// dispatch in hlinear.cpp.
#pragma once

#include <cstdint>

namespace ds::hlinear {

struct Args {
  const float* x;  // m rows of k, fp32 (fp16 x converted once per call)
  int64_t m, k;
  const void* w;  // n rows of k: fp16 bits (w_half) or fp32
  bool w_half;
  int64_t n;
  const void* bias;  // n elements or null
  bool bias_half;
  void* y;  // m rows of n
  bool y_half;
};

#define DS_HLIN_DECLARE(ns)                                              \
  namespace ns {                                                         \
  void rows(const Args& a, int64_t j0, int64_t j1);                      \
  void to_float(const uint16_t* h, int64_t count, float* out);           \
  }

DS_HLIN_DECLARE(scalar)
#if defined(__x86_64__) || defined(__i386__)
DS_HLIN_DECLARE(avx2)
DS_HLIN_DECLARE(avx512)
#endif

}  // namespace ds::hlinear
