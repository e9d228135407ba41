// How much of a one-thread fp16 Adam step is arithmetic the memory cannot hide: times (1) the
// working tree's AVX-512 Adam kernel and (2) a conversion-only probe (the four fp16 loads
// converted to fp32, one add each so nothing is dead, the three fp16 stores converted back) on
// buffers that stay in L1/L2, and (3) the same probe on 50M-element buffers interleaved with the
// bandwidth kernel (4 reads, 3 writes), the two swapping their buffer sets every round, because
// one set of equal buffers can stream 15% slower than another for placement alone.
// Not part of the build. Usage, from the repository root:
//   F="-std=c++17 -O3 -fno-math-errno -ffp-contract=off -mavx512f -mavx512bw -mavx512vl
//      -mavx512dq -mfma -mf16c -mavx512bf16"
//   g++ $F -Inative/include -Inative/src/kernels/optim -o /tmp/compute_f16
//      native/tests/compute_f16.cpp
//   /tmp/compute_f16 [elements=50000000] [rounds=12]
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "ds/optim.h"
#include "driver_common.h"
using namespace ds::optim;

static void convert_only(uint16_t* p, const uint16_t* g, uint16_t* m, uint16_t* v, int64_t n) {
  for (int64_t i = 0; i + 16 <= n; i += 16) {
    __m512 pv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    __m512 gv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + i)));
    __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(m + i)));
    __m512 vv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + i)));
    mv = _mm512_add_ps(mv, gv);
    vv = _mm512_add_ps(vv, gv);
    pv = _mm512_add_ps(pv, mv);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + i), _mm512_cvtps_ph(pv, 8));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(m + i), _mm512_cvtps_ph(mv, 8));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(v + i), _mm512_cvtps_ph(vv, 8));
  }
}

struct Set {
  std::vector<uint16_t> p, g, m, v;
  explicit Set(int64_t n) : p(n), g(n), m(n), v(n) {
    for (int64_t i = 0; i < n; ++i) {  // normal and subnormal halves, as in a real step
      p[i] = _cvtss_sh(0.01f * static_cast<float>(i % 31 - 15), 0);
      g[i] = _cvtss_sh(1e-3f * static_cast<float>(i % 17 - 8), 0);
      m[i] = _cvtss_sh(1e-4f * static_cast<float>(i % 13 - 6), 0);
      v[i] = _cvtss_sh(1e-7f * static_cast<float>(i % 11 + 1), 0);
    }
  }
  Buffers buffers() {
    Buffers b;
    b.param = p.data();
    b.grad = g.data();
    b.state1 = m.data();
    b.state2 = v.data();
    b.n = static_cast<int64_t>(p.size());
    return b;
  }
};

static double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? atoll(argv[1]) : 50000000;
  const int rounds = argc > 2 ? atoi(argv[2]) : 12;
  Types t;
  t.param = t.grad = t.state = DType::kF16;
  const AdamConfig ac = driver_adam_config();

  const int64_t small = 8192, reps = 4000;  // 64 KB over the four arrays
  Set c(small);
  Buffers cb = c.buffers();
  std::vector<double> adam_c, conv_c;
  for (int r = 0; r < 15; ++r) {
    double t0 = now();
    for (int k = 0; k < reps; ++k) vb::adam_range(ac, t, cb, 0, small);
    adam_c.push_back((now() - t0) / reps / small * 1e9);
    t0 = now();
    for (int k = 0; k < reps; ++k) convert_only(c.p.data(), c.g.data(), c.m.data(), c.v.data(), small);
    conv_c.push_back((now() - t0) / reps / small * 1e9);
  }
  printf("in cache, ns/element: Adam kernel %.4f, conversions only %.4f (%.0f%%)\n",
         median(adam_c), median(conv_c), 100 * median(conv_c) / median(adam_c));

  Set s0(n), s1(n);
  std::vector<double> fl, cv, ratio;
  for (int r = 0; r < rounds; ++r) {
    Set& a = r % 2 ? s1 : s0;
    Set& b = r % 2 ? s0 : s1;
    double t0 = now();
    vb::stream_range(a.p.data(), a.g.data(), a.m.data(), a.v.data(), 0, n, 2);
    const double tf = now() - t0;
    t0 = now();
    convert_only(b.p.data(), b.g.data(), b.m.data(), b.v.data(), n);
    const double tc = now() - t0;
    fl.push_back(tf / n * 1e9);
    cv.push_back(tc / n * 1e9);
    ratio.push_back(tc / tf);
  }
  printf("%lld elements, ns/element: floor %.4f, conversions only %.4f; per-round ratio median %.3f"
         " (min %.3f, max %.3f)\n",
         static_cast<long long>(n), median(fl), median(cv), median(ratio),
         *std::min_element(ratio.begin(), ratio.end()),
         *std::max_element(ratio.begin(), ratio.end()));
}
