// In-process A/B driver for the AVX-512 quantizer kernels: a baseline copy of the group-kernel
// headers (any git revision) against the working tree's, one thread, group 128, the two
// versions alternating (quantize outputs swap buffers every other round), a bandwidth kernel
// with the same traffic timed in the same rounds; medians. Also checks that both versions
// write the same bytes. Not part of the build. This file is compiled three times: the baseline
// kernels (-DAB_PART=1), the working tree's (-DAB_PART=2) and the driver (no AB_PART). Usage,
// from the repository root (REV: the baseline revision):
//   mkdir -p /tmp/qab/base
//   for f in quant_impl.h quant_group_avx512.h; do
//     git show REV:native/src/kernels/quant/$f > /tmp/qab/base/$f; done
//   F="-std=c++17 -O3 -fno-math-errno -ffp-contract=off -mavx512f -mavx512bw -mavx512vl
//      -mavx512dq -mfma -mf16c -Inative/include -Inative/src/kernels/quant -I/tmp/qab"
//   g++ $F -DAB_PART=1 -c native/tests/ab_quant.cpp -o /tmp/qab/a.o
//   g++ $F -DAB_PART=2 -c native/tests/ab_quant.cpp -o /tmp/qab/b.o
//   g++ $F -o /tmp/qab/qab native/tests/ab_quant.cpp /tmp/qab/a.o /tmp/qab/b.o
//   /tmp/qab/qab int8_sym|int8_asym|int4_sym|int4_asym|fp8_e4m3|fp8_e5m2 q|d [elements] [rounds]
// SPECIAL=1 puts NaN, +inf and -inf into some groups.
#if defined(AB_PART)
// The kernels' own compile settings (see quant_avx512.cpp).
#pragma GCC optimize("no-trapping-math")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#if AB_PART == 1
#define DS_QUANT_NS qa
#include "base/quant_impl.h"
#else
#define DS_QUANT_NS qb
#include "quant_impl.h"
#endif
#else
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "ds/quant.h"
// The four group kernels of one build (qa: baseline, qb: working tree), defined in parts 1 and 2.
#define DS_AB_DECLARE(NS)                                                                       \
  namespace NS {                                                                                \
  void quantize_int_groups(const void*, InputType, int64_t, int64_t, const IntScheme&, uint8_t*, \
                           float*, float*, int64_t, int64_t);                                   \
  void quantize_fp8_groups(const void*, InputType, int64_t, int64_t, Fp8Format, uint8_t*,       \
                           float*, int64_t, int64_t);                                           \
  void dequantize_int_groups(const uint8_t*, const float*, const float*, int64_t, int64_t,      \
                             const IntScheme&, float*, int64_t, int64_t);                       \
  void dequantize_fp8_groups(const uint8_t*, const float*, int64_t, int64_t, Fp8Format, float*, \
                             int64_t, int64_t);                                                 \
  }
namespace ds::quant {
DS_AB_DECLARE(qa)
DS_AB_DECLARE(qb)
}  // namespace ds::quant
using namespace ds::quant;
static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
__attribute__((noinline)) float floor_read(const float* x, int64_t n) {
  __m512 m0 = _mm512_setzero_ps(), m1 = m0;
  for (int64_t i = 0; i < n; i += 32) {
    m0 = _mm512_max_ps(m0, _mm512_loadu_ps(x + i));
    m1 = _mm512_max_ps(m1, _mm512_loadu_ps(x + i + 16));
  }
  return _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
}
__attribute__((noinline)) void floor_write(uint8_t* o, int64_t bytes, int v) {
  const __m512i z = _mm512_set1_epi8(v);
  for (int64_t i = 0; i + 64 <= bytes; i += 64) _mm512_storeu_si512(o + i, z);
}
int main(int argc, char** argv) {
  const char* which = argc > 1 ? argv[1] : "int8_sym";
  const char* dir = argc > 2 ? argv[2] : "q";  // q | d
  int64_t n = argc > 3 ? atoll(argv[3]) : (64ll << 20) / 4;
  int rounds = argc > 4 ? atoi(argv[4]) : 21;
  const int64_t gs = 128, ng = n / gs;
  std::vector<float> x(n);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (auto& v : x) v = nd(rng);
  if (getenv("SPECIAL")) {  // NaN, +inf, -inf, and a mix, in some groups
    const float sp[4] = {__builtin_nanf(""), __builtin_inff(), -__builtin_inff(), 0.f};
    for (int64_t g = 0; g < n / 128; g += 7) {
      x[g * 128 + (g % 128)] = sp[(g / 7) % 3];
      if (g % 5 == 0) x[g * 128 + 3] = sp[(g / 7 + 1) % 3];
    }
  }
  IntScheme s{8, false, -127, 127};
  bool fp8 = false;
  Fp8Format f = Fp8Format::E4M3;
  if (!strcmp(which, "int8_asym")) s = {8, true, 0, 255};
  if (!strcmp(which, "int4_sym")) s = {4, false, -7, 7};
  if (!strcmp(which, "int4_asym")) s = {4, true, 0, 15};
  if (!strcmp(which, "fp8_e4m3")) fp8 = true;
  if (!strcmp(which, "fp8_e5m2")) {
    fp8 = true;
    f = Fp8Format::E5M2;
  }
  const int64_t bytes = (!fp8 && s.bits == 4) ? n / 2 : n;
  std::vector<uint8_t> d0(bytes), d1(bytes);
  std::vector<float> s0(ng), s1(ng), z0(ng), z1(ng), o0(n), o1(n);
  int swap = 0;  // output buffers alternate between the versions (placement effects cancel)
  auto q = [&](int k) {
    uint8_t* dd = (k ^ swap) ? d1.data() : d0.data();
    float* ss = (k ^ swap) ? s1.data() : s0.data();
    float* zz = (k ^ swap) ? z1.data() : z0.data();
    double t0 = now();
    if (fp8) {
      if (k == 0)
        qa::quantize_fp8_groups(x.data(), InputType::F32, n, gs, f, dd, ss, 0, ng);
      else
        qb::quantize_fp8_groups(x.data(), InputType::F32, n, gs, f, dd, ss, 0, ng);
    } else {
      if (k == 0)
        qa::quantize_int_groups(x.data(), InputType::F32, n, gs, s, dd, ss, zz, 0, ng);
      else
        qb::quantize_int_groups(x.data(), InputType::F32, n, gs, s, dd, ss, zz, 0, ng);
    }
    return now() - t0;
  };
  auto dq = [&](int k) {
    double t0 = now();
    if (fp8) {
      if (k == 0)
        qa::dequantize_fp8_groups(d0.data(), s0.data(), n, gs, f, o0.data(), 0, ng);
      else
        qb::dequantize_fp8_groups(d0.data(), s0.data(), n, gs, f, o1.data(), 0, ng);
    } else {
      if (k == 0)
        qa::dequantize_int_groups(d0.data(), s0.data(), z0.data(), n, gs, s, o0.data(), 0, ng);
      else
        qb::dequantize_int_groups(d0.data(), s0.data(), z0.data(), n, gs, s, o1.data(), 0, ng);
    }
    return now() - t0;
  };
  std::vector<uint8_t> fo(bytes);
  std::vector<float> fx(n, 1.f), fo32(n);
  std::vector<uint8_t> fin(bytes, 1);
  volatile float sink = 0;
  auto fl = [&]() {
    double t0 = now();
    if (*dir == 'q') {
      sink = floor_read(x.data(), n);
      floor_write(fo.data(), bytes, 1);
    } else {
      sink = floor_read(reinterpret_cast<const float*>(fin.data()), bytes / 4);
      floor_write(reinterpret_cast<uint8_t*>(fo32.data()), n * 4, 0);
    }
    return now() - t0;
  };
  auto op = [&](int k) { return *dir == 'q' ? q(k) : dq(k); };
  q(0);
  q(1);
  std::vector<double> ta, tb, tf;
  for (int w = 0; w < 2; ++w) {
    op(0);
    op(1);
    fl();
  }
  for (int r = 0; r < rounds; ++r) {
    if (*dir == 'q') swap = (r >> 1) & 1;
    if (r & 1) {
      tb.push_back(op(1));
      tf.push_back(fl());
      ta.push_back(op(0));
    } else {
      ta.push_back(op(0));
      tf.push_back(fl());
      tb.push_back(op(1));
    }
  }
  for (int64_t i = 0; i < bytes; ++i)
    if (d0[i] != d1[i]) {
      printf("first differing byte %ld: %02x vs %02x\n", (long)i, d0[i], d1[i]);
      break;
    }
  swap = 0;
  if (*dir == 'q') {
    q(0);
    q(1);
  }
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  double a = med(ta), b = med(tb), fm = med(tf);
  bool same = *dir == 'q' ? (d0 == d1 && !memcmp(s0.data(), s1.data(), ng * 4) &&
                             (!s.asym || !memcmp(z0.data(), z1.data(), ng * 4)))
                          : (memcmp(o0.data(), o1.data(), n * 4) == 0);
  printf(
      "%s %s n=%ld: ns/elem floor %.4f A %.4f B %.4f | A %.3fx B %.3fx | B/A %.3f | identical %d\n",
      which, *dir == 'q' ? "quant" : "dequant", (long)n, fm * 1e9 / n, a * 1e9 / n, b * 1e9 / n,
      a / fm, b / fm, b / a, (int)same);
}
#endif  // AB_PART
