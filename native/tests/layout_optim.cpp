// Layout driver for the AVX-512 optimizer kernels: one flat buffer per stream against the same
// elements split over many separately allocated tensors, for the Adam kernel and for the
// bandwidth kernel (4 reads, 3 writes), one thread, all four timed in the same interleaved
// rounds; medians. Not part of the build. Usage, from the repository root:
//   F="-std=c++17 -O3 -fno-math-errno -ffp-contract=off -mavx512f -mavx512bw -mavx512vl
//      -mavx512dq -mfma -mf16c -mavx512bf16"
//   g++ $F -Inative/include -Inative/src/kernels/optim -o /tmp/layout native/tests/layout_optim.cpp
//   /tmp/layout bf16|f16 [elements=50000000] [tensors=200] [rounds=15]
// Allocation of the split layout: ALLOC=malloc (posix_memalign(64), as torch's CPU allocator),
// ALLOC=page (every tensor page-aligned: all streams share address bits 11:0) or
// ALLOC=stagger (page-aligned plus 1 KB times the stream index) or ALLOC=heap (what torch gets
// from glibc in tools/bench/optim.py: tensors packed in the brk heap in the bench's order, all
// grads, then all params, then exp_avg and exp_avg_sq alternating, so page offsets vary).
// ALLOC=state: params and grads at one page offset, each moment at its own.
// FLAT_ALLOC=malloc|page|stagger|state places the flat buffers (tensors=1 with ALLOC=stagger compares
// the flat layout at equal and at staggered page offsets).
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <malloc.h>

#include <random>
#include <string>
#include <vector>

#include "ds/optim.h"

#include "driver_common.h"
using namespace ds::optim;


int main(int argc, char** argv) {
  const bool bf = argc > 1 && !strcmp(argv[1], "bf16");
  const int64_t n = argc > 2 ? atoll(argv[2]) : 50000000;
  const int nt = argc > 3 ? atoi(argv[3]) : 200;
  const int rounds = argc > 4 ? atoi(argv[4]) : 15;
  // The flat set is allocated per FLAT_ALLOC (default malloc), the split one per ALLOC.
  const std::string split_alloc = getenv("ALLOC") ? getenv("ALLOC") : "malloc";
  const std::string flat_alloc = getenv("FLAT_ALLOC") ? getenv("FLAT_ALLOC") : "malloc";
  std::string alloc = split_alloc;
  uint64_t rs = 88172645463325252ull;
  auto nd = [&]() {  // rough normal (sum of 4 uniforms), cheap enough for 10^8 values
    float acc = -2.f;
    for (int k = 0; k < 4; ++k) {
      rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
      acc += (rs >> 40) * (1.f / 16777216.f);
    }
    return acc * 1.7320508f;
  };
  auto fill = [&](uint16_t* q, int64_t m, float scale, bool pos) {
    for (int64_t i = 0; i < m; ++i) {
      float x = nd() * scale;
      if (pos) x = x * x;
      if (bf) {
        uint32_t u;
        memcpy(&u, &x, 4);
        u += 0x7fff + ((u >> 16) & 1);
        q[i] = u >> 16;
      } else {
        q[i] = _cvtss_sh(x, 0);
      }
    }
  };
  auto get = [&](int64_t m, int stream) -> uint16_t* {
    void* r = nullptr;
    if (alloc == "malloc" || alloc == "heap") {
      if (posix_memalign(&r, 64, m * 2)) abort();
      return static_cast<uint16_t*>(r);
    }
    // stagger: every stream at its own page offset; state: param and grad at one offset, the
    // two moments at two others (what an optimizer controls: it allocates only the state)
    const int64_t extra = alloc == "stagger" ? 1024 * stream + 64
                          : alloc == "state" ? (stream >= 2 ? 1024 * (stream - 1) : 0) + 64
                                             : 0;
    if (posix_memalign(&r, 4096, m * 2 + extra)) abort();
    return reinterpret_cast<uint16_t*>(static_cast<uint8_t*>(r) + extra);
  };
  if (split_alloc == "heap") mallopt(M_MMAP_THRESHOLD, 64 << 20);
  const float sc[4] = {0.05f, 1e-2f, 1e-3f, 1e-3f};
  // flat: one buffer per stream; split: nt tensors per stream.
  std::vector<Buffers> flat(1), split(nt), fflat(1), fsplit(nt);
  auto make = [&](std::vector<Buffers>& bs, int parts) {
    if (parts > 1 && alloc == "heap") {
      std::vector<uint16_t*> s[4];
      auto m = [&](int t) { return n / parts + (t < n % parts ? 1 : 0); };
      for (int k : {1, 0, 2})
        for (int t = 0; t < parts; ++t) {
          s[k].push_back(get(m(t), k));
          if (k == 2) s[3].push_back(get(m(t), 3));
        }
      for (int t = 0; t < parts; ++t) {
        for (int k = 0; k < 4; ++k) fill(s[k][t], m(t), sc[k], k == 3);
        bs[t] = Buffers{s[0][t], s[1][t], s[2][t], s[3][t], nullptr, m(t)};
      }
      return;
    }
    for (int t = 0; t < parts; ++t) {
      const int64_t m = n / parts + (t < n % parts ? 1 : 0);
      uint16_t* s[4];
      for (int k = 0; k < 4; ++k) {
        s[k] = parts == 1 ? get(m, k) : get(m, k);
        fill(s[k], m, sc[k], k == 3);
      }
      bs[t].param = s[0];
      bs[t].grad = s[1];
      bs[t].state1 = s[2];
      bs[t].state2 = s[3];
      bs[t].n = m;
    }
  };
  alloc = flat_alloc;
  make(flat, 1);
  alloc = split_alloc;
  make(split, nt);
  alloc = flat_alloc;
  make(fflat, 1);
  alloc = split_alloc;
  make(fsplit, nt);
  Types t;
  t.param = t.grad = t.state = bf ? DType::kBF16 : DType::kF16;
  AdamConfig ac = driver_adam_config();
  auto adam = [&](std::vector<Buffers>& bs) {
    double t0 = now();
    for (auto& b : bs) vb::adam_range(ac, t, b, 0, b.n);
    return now() - t0;
  };
  auto floor_ = [&](std::vector<Buffers>& bs) {
    double t0 = now();
    for (auto& b : bs)
      vb::stream_range(b.param, b.grad, b.state1, b.state2, 0, b.n, 2);
    return now() - t0;
  };
  std::vector<double> r[4];
  for (int w = 0; w < 2; ++w) adam(flat), adam(split), floor_(fflat), floor_(fsplit);
  for (int i = 0; i < rounds; ++i) {
    // rotate the order so no case always follows the same one
    for (int j = 0; j < 4; ++j) {
      const int c = (i + j) % 4;
      r[c].push_back(c == 0 ? adam(flat) : c == 1 ? adam(split) : c == 2 ? floor_(fflat)
                                                                        : floor_(fsplit));
    }
  }
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double af = med(r[0]), as = med(r[1]), ff = med(r[2]), fs = med(r[3]);
  printf("%s n=%ld tensors=%d flat %s, split %s: ms adam flat %.2f split %.2f | floor flat %.2f split %.2f"
         " | adam/floor flat %.3f split %.3f (vs flat floor %.3f) | floor split/flat %.3f\n",
         bf ? "bf16" : "f16", (long)n, nt, flat_alloc.c_str(), split_alloc.c_str(), af * 1e3, as * 1e3, ff * 1e3, fs * 1e3,
         af / ff, as / fs, as / ff, fs / ff);
}
