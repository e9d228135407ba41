// The compute time of the AVX-512 Adam kernels with the memory out of the way: one thread, fp32,
// fp16 and bf16 (state of the param dtype), 8192 elements per buffer (64-128 KiB over the four
// buffers, resident in L2), 4000 steps per round, median of 15 rounds, in ns per element and
// scaled to 50M elements for comparison with the bandwidth floor of tools/bench/optim.py. The
// four buffers lie GAP bytes apart after each other (default 1088: not a multiple of 4 KiB, so
// loads and stores of different buffers do not share address bits 11:0). The data has no zeros
// and stays far from subnormals over the 60000 steps.
// Not part of the build. Usage, from the repository root:
//   F="-std=c++17 -O3 -fno-math-errno -ffp-contract=off -mavx512f -mavx512bw -mavx512vl
//      -mavx512dq -mfma -mf16c -mavx512bf16"
//   g++ $F -Inative/include -Inative/src/kernels/optim -Inative/tests -o /tmp/incache_optim
//      native/tests/incache_optim.cpp
//   GAP=1088 /tmp/incache_optim
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ds/optim.h"
#include "driver_common.h"
using namespace ds::optim;

static double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

int main() {
  const int64_t n = 8192, reps = 4000;
  const int64_t gap = getenv("GAP") ? atoll(getenv("GAP")) : 1088;
  const DType kinds[3] = {DType::kF32, DType::kF16, DType::kBF16};
  const char* names[3] = {"fp32", "fp16", "bf16"};
  for (int k = 0; k < 3; ++k) {
    Types t;
    t.param = t.grad = t.state = kinds[k];
    const int64_t es = kinds[k] == DType::kF32 ? 4 : 2;
    const int64_t stride = n * es + gap;
    std::vector<uint8_t> mem(static_cast<size_t>(stride * 4 + 64));
    uint8_t* base = mem.data() + (64 - reinterpret_cast<uintptr_t>(mem.data()) % 64) % 64;
    void* buf[4];
    for (int s = 0; s < 4; ++s) buf[s] = base + s * stride;
    for (int s = 0; s < 4; ++s) {
      for (int64_t i = 0; i < n; ++i) {
        // Nonzero values: param and grad around 1e-2, moments positive (exp_avg_sq above 1e-3).
        const float x = 1e-3f * ((i % 29) - 14.5f) + (s == 3 ? 0.01f : 0.f);
        if (kinds[k] == DType::kF32) {
          static_cast<float*>(buf[s])[i] = x;
        } else if (kinds[k] == DType::kF16) {
          static_cast<uint16_t*>(buf[s])[i] = _cvtss_sh(x, 0);
        } else {
          uint32_t u;
          memcpy(&u, &x, 4);
          static_cast<uint16_t*>(buf[s])[i] = static_cast<uint16_t>(u >> 16);
        }
      }
    }
    Buffers b = driver_buffers(buf, n);
    const AdamConfig ac = driver_adam_config();
    std::vector<double> ns;
    for (int r = 0; r < 15; ++r) {
      const double t0 = now();
      for (int64_t j = 0; j < reps; ++j) vb::adam_range(ac, t, b, 0, n);
      ns.push_back((now() - t0) / reps / n * 1e9);
    }
    printf("%s Adam in cache: %.4f ns/element (x 50M = %.1f ms)\n", names[k], median(ns),
           median(ns) * 50);
  }
}
