// How the relative placement of the four buffers of an Adam step (param, grad, exp_avg,
// exp_avg_sq) changes its speed: the working tree's AVX-512 Adam kernel and the bandwidth kernel
// (4 reads, 3 writes), one thread, on 50M-element buffers carved out of one mapping at chosen
// addresses. Buffer k starts at slot_mib * k MiB + offset_k bytes from a 2 MiB-aligned base, so
// with equal offsets every pair is congruent modulo the slot size (ds.ops.placement).
// Not part of the build. Usage, from the repository root:
//   F="-std=c++17 -O3 -fno-math-errno -ffp-contract=off -mavx512f -mavx512bw -mavx512vl
//      -mavx512dq -mfma -mf16c -mavx512bf16"
//   g++ $F -Inative/include -Inative/src/kernels/optim -Inative/tests -o /tmp/placement_optim
//      native/tests/placement_optim.cpp
//   /tmp/placement_optim off_param off_grad off_exp_avg off_exp_avg_sq [slot_mib=128] [bits=16]
//   e.g. /tmp/placement_optim 0x40 0x40 0x40 0x40 256     (all four congruent modulo 256 MiB)
//        /tmp/placement_optim 0x40 0x11040 0x22040 0x33040 256   (68 KiB apart)
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "ds/optim.h"
#include "driver_common.h"
using namespace ds::optim;

static double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

int main(int argc, char** argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: %s off_param off_grad off_exp_avg off_exp_avg_sq [slot_mib] [bits]\n",
            argv[0]);
    return 2;
  }
  const int64_t n = 50000000;
  const int64_t slot = (argc > 5 ? atoll(argv[5]) : 128) << 20;
  const int bits = argc > 6 ? atoi(argv[6]) : 16;
  const int64_t elem = bits == 32 ? 4 : 2;
  int64_t off[4];
  for (int k = 0; k < 4; ++k) off[k] = strtoll(argv[1 + k], nullptr, 0);
  for (int k = 0; k < 4; ++k) {
    if (off[k] < 0 || off[k] % 64 || off[k] + n * elem > slot) {
      fprintf(stderr, "offset %s: must be a multiple of 64 and leave the buffer inside its slot\n",
              argv[1 + k]);
      return 2;
    }
  }
  const size_t map = static_cast<size_t>(slot * 4 + (4 << 20));
  char* m = static_cast<char*>(
      mmap(nullptr, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (m == MAP_FAILED) return perror("mmap"), 1;
  char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(m) + (2 << 20) - 1) &
                                       ~static_cast<uintptr_t>((2 << 20) - 1));
  void* a[4];
  for (int k = 0; k < 4; ++k) a[k] = base + k * slot + off[k];

  Types t;
  if (bits == 32) {
    t.param = t.grad = t.state = DType::kF32;
    float* f[4];
    for (int k = 0; k < 4; ++k) f[k] = static_cast<float*>(a[k]);
    for (int64_t i = 0; i < n; ++i) {
      f[0][i] = 0.01f * (i % 31 - 15);
      f[1][i] = 0.1f * (i % 17 - 8);
      f[2][i] = 1e-4f * (i % 13 - 6);
      f[3][i] = 1e-5f * (i % 11 + 1);
    }
  } else {
    t.param = t.grad = t.state = bits == 16 ? DType::kF16 : DType::kBF16;
    uint16_t* h[4];
    for (int k = 0; k < 4; ++k) h[k] = static_cast<uint16_t*>(a[k]);
    for (int64_t i = 0; i < n; ++i) {  // bf16 takes the high half of the fp32 pattern
      const float x[4] = {0.01f * (i % 31 - 15), 0.1f * (i % 17 - 8), 1e-4f * (i % 13 - 6),
                          1e-5f * (i % 11 + 1)};
      for (int k = 0; k < 4; ++k) {
        uint32_t u;
        __builtin_memcpy(&u, &x[k], 4);
        h[k][i] = bits == 16 ? _cvtss_sh(x[k], 0) : static_cast<uint16_t>(u >> 16);
      }
    }
  }
  const AdamConfig ac = driver_adam_config();
  Buffers b = driver_buffers(a, n);
  std::vector<double> ad, fl;
  for (int r = 0; r < 9; ++r) {
    double t0 = now();
    vb::adam_range(ac, t, b, 0, n);
    ad.push_back(now() - t0);
    t0 = now();
    vb::stream_range(a[0], a[1], a[2], a[3], 0, n, static_cast<int>(elem));
    fl.push_back(now() - t0);
  }
  printf("slot %lld MiB, offsets %s %s %s %s, %d-bit: Adam %.2f ms, floor kernel %.2f ms\n",
         static_cast<long long>(slot >> 20), argv[1], argv[2], argv[3], argv[4], bits,
         median(ad) * 1e3, median(fl) * 1e3);
  munmap(m, map);
}
