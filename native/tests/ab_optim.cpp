// In-process A/B driver for the AVX-512 optimizer kernels: a baseline copy of the kernel
// headers (any git revision) against the working tree's, one thread, the two versions
// alternating and swapping buffers every other round (so placement effects cancel), the
// bandwidth kernel (4 reads, 3 writes) timed in the same rounds; medians and minima.
// Not part of the build. Usage, from the repository root (REV: the baseline revision):
//   mkdir -p /tmp/ab/base
//   for f in vec_avx512.h kernels_impl.h; do
//     git show REV:native/src/kernels/optim/$f > /tmp/ab/base/$f; done
//   F="-std=c++17 -O3 -fno-math-errno -ffp-contract=off -mavx512f -mavx512bw -mavx512vl
//      -mavx512dq -mfma -mf16c -mavx512bf16"
//   g++ $F -Inative/include -Inative/src/kernels/optim -I/tmp/ab -o /tmp/ab/ab
//      native/tests/ab_optim.cpp
//   /tmp/ab/ab bf16|f16|f32 adam|adagrad|lion [elements=20000000] [rounds=25]
// VERIFY=1 also runs three steps of both versions on identical data and counts differing bytes;
// STAGGER=k offsets the buffers by multiples of k bytes from page boundaries.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "ds/optim.h"

namespace ds {
namespace optim {
namespace va {
#include "base/vec_avx512.h"
// (after V)
#include "base/kernels_impl.h"
}  // namespace va
}  // namespace optim
}  // namespace ds
#include "driver_common.h"
using namespace ds::optim;

static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return u >> 16;
}
static uint16_t to_f16(float f) { return _cvtss_sh(f, 0); }
struct Buf {
  std::vector<uint8_t> v;
  size_t off = 0;
  uint8_t* p() { return v.data() + off; }
};

int main(int argc, char** argv) {
  const char* kind = argc > 1 ? argv[1] : "bf16";
  const char* opt = argc > 2 ? argv[2] : "adam";
  int64_t n = argc > 3 ? atoll(argv[3]) : 20000000;
  int rounds = argc > 4 ? atoi(argv[4]) : 25;
  const int64_t stag = getenv("STAGGER") ? atoll(getenv("STAGGER")) : 0;
  int nb = 0;
  DType d = !strcmp(kind, "bf16") ? DType::kBF16 : !strcmp(kind, "f16") ? DType::kF16 : DType::kF32;
  int eb = d == DType::kF32 ? 4 : 2;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto mk = [&](float scale, bool pos) {
    Buf b;
    b.v.resize(n * eb + 16384);
    uintptr_t a = reinterpret_cast<uintptr_t>(b.v.data());
    b.off = ((4096 - (a % 4096)) % 4096) + (stag * (nb++ % 8)) % 8192;  // page-aligned + stagger
    uint8_t* q = b.p();
    for (int64_t i = 0; i < n; ++i) {
      float x = nd(rng) * scale;
      if (pos) x = x * x;
      if (eb == 4)
        memcpy(q + i * 4, &x, 4);
      else {
        uint16_t h = d == DType::kBF16 ? to_bf16(x) : to_f16(x);
        memcpy(q + i * 2, &h, 2);
      }
    }
    return b;
  };
  Buf P[2], G, M[2], Vv[2];
  G = mk(1e-2f, false);
  auto init = [&](int k) {
    rng.seed(2);
    P[k] = mk(0.05f, false);
    M[k] = mk(1e-3f, false);
    Vv[k] = mk(1e-3f, true);
  };
  init(0);
  init(1);
  Types t;
  t.param = d;
  t.grad = d;
  t.state = d;
  AdamConfig ac = driver_adam_config();
  AdagradConfig gc;
  gc.weight_decay = 0.01f;
  LionConfig lc;
  lc.lr_wd = 1e-6f;
  lc.weight_decay = 0.01f;
  Buf fa = mk(1, false), fb = mk(1, false), fc = mk(1, false), fd = mk(1, false);
  auto run = [&](int k, int buf) {
    Buffers b;
    b.param = P[buf].p();
    b.grad = G.p();
    b.state1 = M[buf].p();
    b.state2 = Vv[buf].p();
    b.n = n;
    double t0 = now();
    if (!strcmp(opt, "adam")) {
      if (k == 0)
        va::adam_range(ac, t, b, 0, n);
      else
        vb::adam_range(ac, t, b, 0, n);
    } else if (!strcmp(opt, "adagrad")) {
      if (k == 0)
        va::adagrad_range(gc, t, b, 0, n);
      else
        vb::adagrad_range(gc, t, b, 0, n);
    } else {
      if (k == 0)
        va::lion_range(lc, t, b, 0, n);
      else
        vb::lion_range(lc, t, b, 0, n);
    }
    return now() - t0;
  };
  auto floor_ = [&]() {
    double t0 = now();
    va::stream_range(fa.p(), fb.p(), fc.p(), fd.p(), 0, n, eb);
    return now() - t0;
  };
  std::vector<double> ta, tb, tf;
  for (int w = 0; w < 2; ++w) {
    run(0, 0);
    run(1, 1);
    floor_();
  }
  for (int r = 0; r < rounds; ++r) {
    const int x = (r >> 1) & 1;  // buffers swap between the versions every other round
    if (r & 1) {
      tb.push_back(run(1, 1 - x));
      tf.push_back(floor_());
      ta.push_back(run(0, x));
    } else {
      ta.push_back(run(0, x));
      tf.push_back(floor_());
      tb.push_back(run(1, 1 - x));
    }
  }
  int64_t diff = -1;
  if (getenv("VERIFY")) {  // fresh identical data, 3 steps each, compare bytes
    init(0);
    init(1);
    for (int s = 0; s < 3; ++s) {
      run(0, 0);
      run(1, 1);
    }
    diff = 0;
    for (int64_t i = 0; i < n * eb; ++i)
      diff += (P[0].p()[i] != P[1].p()[i]) + (M[0].p()[i] != M[1].p()[i]) +
              (Vv[0].p()[i] != Vv[1].p()[i]);
  }
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  auto mn = [](std::vector<double> v) { return *std::min_element(v.begin(), v.end()); };
  double a = med(ta), b = med(tb), f = med(tf);
  printf(
      "%s %s n=%ld stag=%ld: ns/elem floor %.4f A %.4f B %.4f | A %.3fx B %.3fx floor | B/A %.3f | "
      "min A %.3fx B %.3fx | bytes differing %ld\n",
      kind, opt, (long)n, (long)stag, f * 1e9 / n, a * 1e9 / n, b * 1e9 / n, a / f, b / f, b / a,
      mn(ta) / mn(tf), mn(tb) / mn(tf), (long)diff);
}
