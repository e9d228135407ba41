// Where a one-thread low-precision Adam step spends its compute, with no memory traffic at all.
// (1) Throughput of the instructions the fp16/bf16 step is made of, alone and in pairs (8
//     independent instructions per pair type, repeated), in cycles, taking vmulps as 1 cycle:
//     a pair that costs the sum of its parts shares an execution resource.
// (2) The step's own instruction mix on registers only (inputs re-read from registers, outputs
//     kept live, independent iterations): the Adam arithmetic alone (the low-precision body of
//     adam_typed, written with the kernels' V primitives), the conversions alone, and both; in
//     ns per element, against the bandwidth floor of tools/bench/optim.py given as FLOOR_NS (ns
//     per element; 0.258 is 12.9 ms for 50M elements, the placed one-thread fp16 floor).
// Not part of the build. Usage, from the repository root:
//   F="-std=c++17 -O3 -fno-math-errno -ffp-contract=off -mavx512f -mavx512bw -mavx512vl
//      -mavx512dq -mfma -mf16c -mavx512bf16"
//   g++ $F -Inative/include -Inative/src/kernels/optim -Inative/tests -o /tmp/pipes_optim
//      native/tests/pipes_optim.cpp
//   FLOOR_NS=0.258 /tmp/pipes_optim
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "ds/optim.h"
#include "driver_common.h"
using V = ds::optim::vb::V;

// Keeps a value in a register and opaque to the compiler: neither hoisted nor dead.
#define KEEP(x) asm volatile("" : "+v"(x))

// (1) Blocks of 8 instructions, each writing its own register from zmm0 (or ymm0) alone, so none
// waits on another's result. %% escapes the register names inside extended asm.
#define REP(body) asm volatile(".rept 25\n" body ".endr\n" ::: "xmm1", "xmm2", "xmm3", "xmm4", \
                               "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "memory")
#define MUL4 "vmulps %%zmm0,%%zmm0,%%zmm6\n vmulps %%zmm0,%%zmm0,%%zmm7\n " \
             "vmulps %%zmm0,%%zmm0,%%zmm8\n vmulps %%zmm0,%%zmm0,%%zmm9\n"
#define ADD4 "vaddps %%zmm0,%%zmm0,%%zmm6\n vaddps %%zmm0,%%zmm0,%%zmm7\n " \
             "vaddps %%zmm0,%%zmm0,%%zmm8\n vaddps %%zmm0,%%zmm0,%%zmm9\n"
#define UP4 "vcvtph2ps %%ymm0,%%zmm1\n vcvtph2ps %%ymm0,%%zmm2\n " \
            "vcvtph2ps %%ymm0,%%zmm3\n vcvtph2ps %%ymm0,%%zmm4\n"
#define DOWN4 "vcvtps2ph $8,%%zmm0,%%ymm1\n vcvtps2ph $8,%%zmm0,%%ymm2\n " \
              "vcvtps2ph $8,%%zmm0,%%ymm3\n vcvtps2ph $8,%%zmm0,%%ymm4\n"
#define RSQ4 "vrsqrt14ps %%zmm0,%%zmm1\n vrsqrt14ps %%zmm0,%%zmm2\n " \
             "vrsqrt14ps %%zmm0,%%zmm3\n vrsqrt14ps %%zmm0,%%zmm4\n"
#define BF4 "vcvtne2ps2bf16 %%zmm0,%%zmm0,%%zmm1\n vcvtne2ps2bf16 %%zmm0,%%zmm0,%%zmm2\n " \
            "vcvtne2ps2bf16 %%zmm0,%%zmm0,%%zmm3\n vcvtne2ps2bf16 %%zmm0,%%zmm0,%%zmm4\n"

struct Probe {
  const char* name;
  void (*run)(int64_t);
  int per_block;  // divisor per block of 8: 8 for one kind, 4 for a pair (one of each)
};
// zmm0 holds 1.0f in every lane (so no input is subnormal or NaN); nothing else reads it.
static const float kOne = 1.f;
#define PROBE(fn, body)                                                      \
  static void fn(int64_t it) {                                               \
    asm volatile("vbroadcastss %0, %%zmm0" : : "m"(kOne) : "xmm0");          \
    for (int64_t k = 0; k < it; ++k) REP(body);                              \
  }
PROBE(p_mul, MUL4 MUL4)
PROBE(p_add, ADD4 ADD4)
PROBE(p_up, UP4 UP4)
PROBE(p_down, DOWN4 DOWN4)
PROBE(p_rsq, RSQ4 RSQ4)
PROBE(p_bf, BF4 BF4)
PROBE(p_mul_add, MUL4 ADD4)
PROBE(p_up_mul, UP4 MUL4)
PROBE(p_up_add, UP4 ADD4)
PROBE(p_down_mul, DOWN4 MUL4)
PROBE(p_down_add, DOWN4 ADD4)
PROBE(p_up_down, UP4 DOWN4)
PROBE(p_rsq_mul, RSQ4 MUL4)
PROBE(p_rsq_up, RSQ4 UP4)
PROBE(p_rsq_down, RSQ4 DOWN4)
PROBE(p_bf_mul, BF4 MUL4)
PROBE(p_bf_add, BF4 ADD4)

static double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

// Seconds per block (25 repetitions of 8 instructions), median of 9.
static double block_time(void (*fn)(int64_t)) {
  const int64_t it = 200000;
  std::vector<double> t;
  for (int r = 0; r < 9; ++r) {
    const double t0 = now();
    fn(it);
    t.push_back((now() - t0) / (it * 25.0));
  }
  return median(t);
}

// (2) The low-precision Adam body of adam_typed (AdamW, folded step), on registers.
struct Consts {
  V::reg omb1, omb2, fa, fb, decay;
};
static inline void adam_body(const Consts& c, V::reg& p, V::reg g, V::reg& m, V::reg& v) {
  m = V::fma(c.omb1, V::sub(g, m), m);
  v = V::fma(c.omb2, V::fmsub(g, g, v), v);
  const V::reg q = V::rough_div(m, V::fma(V::rough_sqrt(v), c.fa, c.fb));
  p = V::fma(p, c.decay, q);
}

enum Mix { kArith, kConvert, kBoth };

// Keeps both halves of a V::reg in registers (named locals, never arrays, so nothing spills).
#define KEEP2(r) \
  do {             \
    KEEP((r).a);   \
    KEEP((r).b);   \
  } while (0)

static inline V::reg widen(__m256i lo, __m256i hi) {
  KEEP(lo);
  KEEP(hi);
  return {_mm512_cvtph_ps(lo), _mm512_cvtph_ps(hi)};
}
static inline void narrow(V::reg x) {
  __m256i lo = _mm512_cvtps_ph(x.a, 8), hi = _mm512_cvtps_ph(x.b, 8);
  KEEP(lo);
  KEEP(hi);
}

// fp16: per 32 lanes, 8 vcvtph2ps in and 6 vcvtps2ph out. ns per element, median of 9.
template <Mix M>
static double f16_mix(const Consts& c0) {
  const int64_t it = 4000000;
  Consts c = c0;
  const __m256i h0 = _mm256_set1_epi16(0x2000), h1 = _mm256_set1_epi16(0x2040);
  const __m256i h2 = _mm256_set1_epi16(0x2080), h3 = _mm256_set1_epi16(0x20c0);
  const V::reg f0 = V::set1(0.01f), f1 = V::set1(0.011f), f2 = V::set1(0.012f);
  const V::reg f3 = V::set1(0.013f);
  std::vector<double> t;
  for (int r = 0; r < 9; ++r) {
    const double t0 = now();
    for (int64_t k = 0; k < it; ++k) {
      V::reg p, g, m, v;
      if (M == kArith) {
        p = f0, g = f1, m = f2, v = f3;
        KEEP2(p);
        KEEP2(g);
        KEEP2(m);
        KEEP2(v);
      } else {
        p = widen(h0, h1), g = widen(h1, h2), m = widen(h2, h3), v = widen(h3, h0);
      }
      if (M == kConvert) {
        KEEP2(g);  // the step reads the grad; the probe keeps it live instead
      } else {
        adam_body(c, p, g, m, v);
      }
      if (M == kArith) {
        KEEP2(p);
        KEEP2(m);
        KEEP2(v);
      } else {
        narrow(p);
        narrow(m);
        narrow(v);
      }
    }
    t.push_back((now() - t0) / (it * 32.0) * 1e9);
  }
  return median(t);
}

int main() {
  const double floor_ns = getenv("FLOOR_NS") ? atof(getenv("FLOOR_NS")) : 0.258;
  const Probe probes[] = {
      {"vmulps", p_mul, 8},
      {"vaddps", p_add, 8},
      {"vcvtph2ps", p_up, 8},
      {"vcvtps2ph", p_down, 8},
      {"vrsqrt14ps", p_rsq, 8},
      {"vcvtne2ps2bf16", p_bf, 8},
      {"vmulps + vaddps", p_mul_add, 4},
      {"vcvtph2ps + vmulps", p_up_mul, 4},
      {"vcvtph2ps + vaddps", p_up_add, 4},
      {"vcvtps2ph + vmulps", p_down_mul, 4},
      {"vcvtps2ph + vaddps", p_down_add, 4},
      {"vcvtph2ps + vcvtps2ph", p_up_down, 4},
      {"vrsqrt14ps + vmulps", p_rsq_mul, 4},
      {"vrsqrt14ps + vcvtph2ps", p_rsq_up, 4},
      {"vrsqrt14ps + vcvtps2ph", p_rsq_down, 4},
      {"vcvtne2ps2bf16 + vmulps", p_bf_mul, 4},
      {"vcvtne2ps2bf16 + vaddps", p_bf_add, 4},
  };
  const double cycle = block_time(p_mul) / 8;  // vmulps zmm: one per cycle
  printf("(1) zmm throughput, cycles per instruction (pairs: per one of each)\n");
  for (const Probe& p : probes) {
    printf("  %-26s %5.2f\n", p.name, block_time(p.run) / p.per_block / cycle);
  }
  Consts c;
  c.omb1 = V::set1(0.1f);
  c.omb2 = V::set1(0.001f);
  c.fa = V::set1(-100.f);
  c.fb = V::set1(-1e-6f);
  c.decay = V::set1(0.99999f);
  const double arith = f16_mix<kArith>(c), conv = f16_mix<kConvert>(c), both = f16_mix<kBoth>(c);
  printf("(2) fp16 Adam step on registers, ns/element (x floor %.3f ns)\n", floor_ns);
  printf("  arithmetic only   %.4f (%.2fx)\n", arith, arith / floor_ns);
  printf("  conversions only  %.4f (%.2fx)\n", conv, conv / floor_ns);
  printf("  both              %.4f (%.2fx)\n", both, both / floor_ns);
  return 0;
}
