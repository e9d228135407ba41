// Compares the NEON variant of the optimizer kernels with the scalar variant on an aarch64 build
// of the kernel library (run under qemu-aarch64 by packages/ops-kernels/tests/test_neon_cross.py).
//
// Both variants run through the real dispatch (ds::optim::*_step after ds::set_simd_level) on
// copies of the same pseudo-random inputs: Adam (decoupled and L2 decay), Adagrad, Lion, every
// supported dtype combination, odd sizes around the 8-lane width and across thread splits,
// five steps; every stored element must be bit-identical (see compare()). Pure conversions
// (lr = 0, ties, subnormals, inf, NaN) are checked the same way.
// Prints one line per failure and "neon_check ok: N cases" at the end; exit status 1 on failure.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../src/kernels/optim/half.h"
#include "ds/optim.h"
#include "ds/simd.h"
#include "ds/thread_pool.h"

using ds::optim::Buffers;
using ds::optim::DType;
using ds::optim::Types;

namespace {

int g_failures = 0;
int g_cases = 0;
size_t g_elements = 0;

struct Rng {
  uint64_t s;
  float uniform() {  // [-1, 1)
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(static_cast<int64_t>(s >> 40) - (1 << 23)) / (1 << 23);
  }
};

size_t width(DType d) { return d == DType::kF32 ? 4 : 2; }

float get(const std::vector<uint8_t>& buf, DType d, size_t i) {
  if (d == DType::kF32) {
    float f;
    std::memcpy(&f, buf.data() + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, buf.data() + 2 * i, 2);
  return d == DType::kBF16 ? ds::optim::bf16_to_f32(h) : ds::optim::f16_to_f32(h);
}

void put(std::vector<uint8_t>& buf, DType d, size_t i, float f) {
  if (d == DType::kF32) {
    std::memcpy(buf.data() + 4 * i, &f, 4);
    return;
  }
  const uint16_t h = d == DType::kBF16 ? ds::optim::f32_to_bf16(f) : ds::optim::f32_to_f16(f);
  std::memcpy(buf.data() + 2 * i, &h, 2);
}

struct Tensors {
  std::vector<uint8_t> p, s1, s2, low;
};

// Both variants perform the same IEEE operations in the same order (the kernel library is
// built with -ffp-contract=off, the scalar fma is fused on aarch64, and AArch64's vector sqrt and
// division are correctly rounded), so every stored element must be bit-identical.
void compare(const std::string& what, DType d, const std::vector<uint8_t>& got,
             const std::vector<uint8_t>& want, size_t n) {
  size_t bad = 0;
  const size_t w = width(d);
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(got.data() + w * i, want.data() + w * i, w) == 0) continue;
    if (bad++ < 3)
      std::printf("FAIL %s [%zu]: neon %.9g scalar %.9g\n", what.c_str(), i, get(got, d, i),
                  get(want, d, i));
  }
  g_elements += n;
  if (bad) ++g_failures;
}

enum class Kind { kAdamW, kAdamL2, kAdagrad, kLion };
const char* name(Kind k) {
  switch (k) {
    case Kind::kAdamW: return "adamw";
    case Kind::kAdamL2: return "adam-l2";
    case Kind::kAdagrad: return "adagrad";
    case Kind::kLion: return "lion";
  }
  return "?";
}
const char* name(DType d) {
  switch (d) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kNone: return "none";
  }
  return "?";
}

void run_steps(Kind k, const Types& t, Tensors& x, const std::vector<std::vector<uint8_t>>& grads,
               size_t n, float lr) {
  Buffers b;
  b.param = x.p.data();
  b.state1 = x.s1.data();
  b.state2 = x.s2.data();
  b.lowp = t.lowp == DType::kNone ? nullptr : x.low.data();
  b.n = static_cast<int64_t>(n);
  int step = 0;
  for (const auto& g : grads) {
    ++step;
    b.grad = g.data();
    if (k == Kind::kAdamW || k == Kind::kAdamL2) {
      ds::optim::AdamConfig c;
      c.lr = lr;
      c.weight_decay = 0.01f;
      c.adamw_mode = k == Kind::kAdamW;
      const double bc1 = 1.0 - std::pow(0.9, step), bc2 = 1.0 - std::pow(0.999, step);
      c.step_size = static_cast<float>(lr / bc1);
      c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
      c.one_minus_beta1 = static_cast<float>(1.0 - 0.9);
      c.one_minus_beta2 = static_cast<float>(1.0 - 0.999);
      c.decay = static_cast<float>(1.0 - static_cast<double>(lr) * 0.01);
      ds::optim::adam_step(c, t, {b});
    } else if (k == Kind::kAdagrad) {
      ds::optim::AdagradConfig c;
      c.lr = lr;
      c.weight_decay = 0.01f;
      ds::optim::adagrad_step(c, t, {b});
    } else {
      ds::optim::LionConfig c;
      c.lr = lr;
      c.weight_decay = 0.01f;
      c.one_minus_beta1 = static_cast<float>(1.0 - 0.9);
      c.one_minus_beta2 = static_cast<float>(1.0 - 0.99);
      c.lr_wd = static_cast<float>(static_cast<double>(lr) * 0.01);
      ds::optim::lion_step(c, t, {b});
    }
  }
}

void check_case(Kind k, const Types& t, size_t n, uint64_t seed) {
  ++g_cases;
  Rng rng{seed};
  Tensors x;
  x.p.resize(n * width(t.param));
  x.s1.resize(n * width(t.state));
  x.s2.resize(n * width(t.state));
  x.low.resize(n * 2);
  for (size_t i = 0; i < n; ++i) {
    put(x.p, t.param, i, 3.f * rng.uniform());
    put(x.s1, t.state, i, 0.1f * rng.uniform());
    const float v = 0.01f * rng.uniform();
    put(x.s2, t.state, i, v * v);
  }
  std::vector<std::vector<uint8_t>> grads(5, std::vector<uint8_t>(n * width(t.grad)));
  for (auto& g : grads)
    for (size_t i = 0; i < n; ++i) put(g, t.grad, i, rng.uniform());

  Tensors y = x;
  if (!ds::set_simd_level(ds::SimdLevel::kNeon)) {
    std::printf("FAIL: the NEON level cannot be selected\n");
    ++g_failures;
    return;
  }
  run_steps(k, t, x, grads, n, 1e-2f);
  ds::set_simd_level(ds::SimdLevel::kScalar);
  run_steps(k, t, y, grads, n, 1e-2f);

  char what[128];
  std::snprintf(what, sizeof what, "%s p=%s g=%s s=%s low=%s n=%zu", name(k), name(t.param),
                name(t.grad), name(t.state), name(t.lowp), n);
  compare(std::string(what) + " param", t.param, x.p, y.p, n);
  compare(std::string(what) + " state1", t.state, x.s1, y.s1, n);
  if (k == Kind::kAdamW || k == Kind::kAdamL2)
    compare(std::string(what) + " state2", t.state, x.s2, y.s2, n);
  if (t.lowp != DType::kNone) compare(std::string(what) + " low", t.lowp, x.low, y.low, n);
}

// lr = 0 and zero moments and grads: params unchanged, the low-precision copy is a pure
// conversion, which both variants must produce bit for bit (ties, subnormals, inf, NaN).
void check_conversions() {
  std::vector<float> vals = {0.f,       -0.f,      1.f,         -1.f,        INFINITY,
                             -INFINITY, NAN,       -NAN,        65504.f,     65519.f,
                             65520.f,   1e5f,      6.1e-5f,     6.0e-8f,     3.0e-8f,
                             2.9e-8f,   1e-40f,    -1e-40f,     1.17549435e-38f,
                             3.4028235e38f,        1.f + 0x1p-8f, 1.f + 0x1p-9f,
                             1.f + 3 * 0x1p-9f,    1.f + 0x1p-11f, 1.f + 3 * 0x1p-11f};
  Rng rng{99};
  for (int i = 0; i < 2000; ++i) vals.push_back(rng.uniform() * (i % 2 ? 1e3f : 1e-6f));
  const size_t n = vals.size();
  for (DType low : {DType::kBF16, DType::kF16}) {
    ++g_cases;
    std::vector<uint16_t> out[2];
    for (int variant = 0; variant < 2; ++variant) {
      ds::set_simd_level(variant == 0 ? ds::SimdLevel::kNeon : ds::SimdLevel::kScalar);
      std::vector<float> p = vals, g(n, 0.f), m(n, 0.f), v(n, 0.f);
      out[variant].assign(n, 0);
      Buffers b;
      b.param = p.data();
      b.grad = g.data();
      b.state1 = m.data();
      b.state2 = v.data();
      b.lowp = out[variant].data();
      b.n = static_cast<int64_t>(n);
      ds::optim::AdamConfig c;
      c.lr = 0.f;
      c.step_size = 0.f;
      ds::optim::adam_step(c, Types{DType::kF32, DType::kF32, DType::kF32, low}, {b});
    }
    for (size_t i = 0; i < n; ++i) {
      if (out[0][i] != out[1][i]) {
        std::printf("FAIL conversion to %s of %.9g: neon 0x%04x scalar 0x%04x\n", name(low),
                    vals[i], out[0][i], out[1][i]);
        ++g_failures;
        break;
      }
    }
  }
}

}  // namespace

int main() {
  if (ds::detected_simd_level() != ds::SimdLevel::kNeon) {
    std::printf("FAIL: detected level is %s, not neon\n",
                ds::simd_level_name(ds::detected_simd_level()));
    return 1;
  }
  std::printf("built levels: %s\n", ds::simd_levels_built());
  ds::set_num_threads(2);  // sizes above the pool's grain are split across two threads
  const std::vector<Types> combos = {
      {DType::kF32, DType::kF32, DType::kF32, DType::kNone},
      {DType::kF32, DType::kF32, DType::kF32, DType::kBF16},
      {DType::kF32, DType::kF32, DType::kF32, DType::kF16},
      {DType::kBF16, DType::kBF16, DType::kBF16, DType::kNone},
      {DType::kBF16, DType::kF32, DType::kF32, DType::kNone},
      {DType::kF16, DType::kF16, DType::kF16, DType::kNone},
      {DType::kF16, DType::kF16, DType::kF32, DType::kNone},
  };
  const size_t sizes[] = {1, 7, 8, 9, 1023, 4099, 70001};
  uint64_t seed = 1;
  for (Kind k : {Kind::kAdamW, Kind::kAdamL2, Kind::kAdagrad, Kind::kLion})
    for (const Types& t : combos)
      for (size_t n : sizes) check_case(k, t, n, seed++);
  check_conversions();
  if (g_failures) {
    std::printf("neon_check FAILED: %d of %d cases\n", g_failures, g_cases);
    return 1;
  }
  std::printf("neon_check ok: %d cases, %zu elements bit-identical\n", g_cases, g_elements);
  return 0;
}
