// Shared by the kernel drivers in native/tests (not part of the build): the working tree's
// AVX-512 optimizer kernels in namespace ds::optim::vb, the Adam settings they time, and a wall
// clock in seconds.
// Include after "ds/optim.h"; compile with -Inative/src/kernels/optim.
#pragma once

#include <immintrin.h>

#include <chrono>
#include <cmath>
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

// The Adam hyperparameters both drivers time (AdamW, step 10 of lr 1e-3, betas 0.9/0.999).
static inline ds::optim::AdamConfig driver_adam_config() {
  ds::optim::AdamConfig ac;
  ac.weight_decay = 0.01f;
  ac.step_size = 1e-3f / (1 - std::pow(0.9, 10));
  ac.inv_sqrt_bc2 = 1.0 / std::sqrt(1 - std::pow(0.999, 10));
  ac.one_minus_beta1 = 0.1f;
  ac.one_minus_beta2 = 0.001f;
  ac.decay = 1 - 1e-5;
  return ac;
}

// Buffers over four arrays of n elements: param, grad, exp_avg, exp_avg_sq.
static inline ds::optim::Buffers driver_buffers(void* const a[4], int64_t n) {
  ds::optim::Buffers b;
  b.param = a[0];
  b.grad = a[1];
  b.state1 = a[2];
  b.state2 = a[3];
  b.n = n;
  return b;
}

static inline double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
