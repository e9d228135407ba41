// Shared by the kernel drivers in native/tests (not part of the build): the working tree's
// AVX-512 optimizer kernels in namespace ds::optim::vb, and a wall clock in seconds.
// Include after "ds/optim.h"; compile with -Inative/src/kernels/optim.
#pragma once

#include <immintrin.h>

#include <chrono>
#include <cstdint>

namespace ds {
namespace optim {
namespace vb {
#include "vec_avx512.h"
// (after V)
#include "kernels_impl.h"
}  // namespace vb
}  // namespace optim
}  // namespace ds

static inline double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
