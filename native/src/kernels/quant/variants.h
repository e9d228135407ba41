// Per-ISA entry points of the quantization kernels; quant.cpp dispatches among them at run time.
// Each handles groups [g0, g1); the caller splits groups across threads.
#pragma once

#include <cstdint>

#include "ds/quant.h"

#define DS_QUANT_DECLARE_VARIANT(ns)                                                         \
  namespace ns {                                                                             \
  void quantize_int_groups(const void* x, InputType in, int64_t n, int64_t gs,              \
                           const IntScheme& s, uint8_t* data, float* scales, float* zps,    \
                           int64_t g0, int64_t g1);                                          \
  void quantize_fp8_groups(const void* x, InputType in, int64_t n, int64_t gs, Fp8Format f, \
                           uint8_t* data, float* scales, int64_t g0, int64_t g1);           \
  void dequantize_int_groups(const uint8_t* data, const float* scales, const float* zps,    \
                             int64_t n, int64_t gs, const IntScheme& s, float* out,         \
                             int64_t g0, int64_t g1);                                        \
  void dequantize_fp8_groups(const uint8_t* data, const float* scales, int64_t n,           \
                             int64_t gs, Fp8Format f, float* out, int64_t g0, int64_t g1);  \
  }

namespace ds::quant {
DS_QUANT_DECLARE_VARIANT(scalar)
#if defined(__x86_64__) || defined(__i386__)
DS_QUANT_DECLARE_VARIANT(avx2)
DS_QUANT_DECLARE_VARIANT(avx512)
#endif
}  // namespace ds::quant
