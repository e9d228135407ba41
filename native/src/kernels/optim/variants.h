// Per-ISA entry points of the optimizer kernels; optim.cpp dispatches among them at run time.
// Each works on elements [begin, end) of one tensor; the caller splits work across threads.
#pragma once

#include <cstdint>

#include "ds/optim.h"

#define DS_OPTIM_DECLARE_VARIANT(ns)                                                          \
  namespace ns {                                                                              \
  void adam_range(const AdamConfig& cfg, const Types& t, const Buffers& b, int64_t begin,    \
                  int64_t end);                                                               \
  void adagrad_range(const AdagradConfig& cfg, const Types& t, const Buffers& b,             \
                     int64_t begin, int64_t end);                                             \
  void lion_range(const LionConfig& cfg, const Types& t, const Buffers& b, int64_t begin,    \
                  int64_t end);                                                               \
  void stream_range(void* a, const void* b, void* c, void* d, int64_t begin, int64_t end,    \
                    int elem_bytes);                                                          \
  }

namespace ds {
namespace optim {
DS_OPTIM_DECLARE_VARIANT(scalar)
#if defined(__x86_64__) || defined(__i386__)
DS_OPTIM_DECLARE_VARIANT(avx2)
DS_OPTIM_DECLARE_VARIANT(avx512)
DS_OPTIM_DECLARE_VARIANT(avx512bf16)
#endif
#if defined(__aarch64__) && defined(DS_HAVE_NEON)
DS_OPTIM_DECLARE_VARIANT(neon)
#endif
}  // namespace optim
}  // namespace ds
