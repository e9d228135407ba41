// One ISA variant of the paged decode attention (ds/attention.h), per file including this header
// with DS_PDA_NS set. Written as loops over 16 independent lanes that the compiler vectorizes with
// the file's ISA flags; no reduction is reordered (the build has -ffp-contract=off and no
// -ffast-math), so every variant rounds the same operations in the same order and all agree bit
// for bit. The order follows the PyTorch path: (q . k) * scale, exp(s - max), / sum, then the
// probabilities times v summed over the keys in order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ds/attention.h"

namespace ds::attention {
namespace DS_PDA_NS {
namespace {

constexpr int kLanes = 16;

// The 16 partial sums of a dot product, added pairwise (the same tree in every variant).
inline float tree16(const float* a) {
  float b[8], c[4];
  for (int i = 0; i < 8; ++i) b[i] = a[i] + a[i + 8];
  for (int i = 0; i < 4; ++i) c[i] = b[i] + b[i + 4];
  return (c[0] + c[2]) + (c[1] + c[3]);
}

inline float dot(const float* x, const float* y, int64_t d) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= d; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += x[i + l] * y[i + l];
  for (int l = 0; i + l < d; ++l) acc[l] += x[i + l] * y[i + l];
  return tree16(acc);
}

// e^x for x <= 0 (scores minus their maximum): x = n ln2 + r with |r| <= ln2 / 2, e^r by
// Cephes's degree-6 polynomial (about 1 ulp), times 2^n built in the exponent bits; below
// -87.3 (under the smallest normal) 0. Branch-free so that the loop over keys vectorizes.
inline float exp_nonpos(float x) {
  const float xc = x < -87.3f ? -87.3f : x;
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  const float e = p * scale;
  return x < -87.3f ? 0.0f : e;
}

}  // namespace

// Sequences x key/value heads [w0, w1) (item = s * KVH + kvh).
void paged_decode_items(const PagedDecode& p, int64_t w0, int64_t w1) {
  const int64_t G = p.H / p.KVH, D = p.D, BS = p.BS;
  thread_local std::vector<float> buf;
  for (int64_t w = w0; w < w1; ++w) {
    const int64_t s = w / p.KVH, kvh = w % p.KVH, n = p.ctx[s];
    if (static_cast<int64_t>(buf.size()) < G * n) buf.resize(static_cast<size_t>(G * n));
    const int32_t* table = p.tables + s * p.max_blocks;
    const float* kbase = p.k_cache + kvh * p.NB * BS * D;
    const float* vbase = p.v_cache + kvh * p.NB * BS * D;
    const float* q = p.q + (s * p.H + kvh * G) * D;
    // Scores: each key row read once for the G query heads that share it. Keys are walked block
    // by block (a division per key cost a quarter of the kernel's time).
    for (int64_t t0 = 0; t0 < n; t0 += BS) {
      const float* keys = kbase + static_cast<int64_t>(table[t0 / BS]) * BS * D;
      for (int64_t t = t0; t < std::min(n, t0 + BS); ++t) {
        const float* key = keys + (t - t0) * D;
        for (int64_t j = 0; j < G; ++j) buf[j * n + t] = dot(q + j * D, key, D) * p.scale;
      }
    }
    for (int64_t j = 0; j < G; ++j) {
      float* sc = buf.data() + j * n;
      float m = sc[0];
      for (int64_t t = 1; t < n; ++t) m = sc[t] > m ? sc[t] : m;
      for (int64_t t = 0; t < n; ++t) sc[t] = exp_nonpos(sc[t] - m);
      float sum = 0.0f;  // in key order, as the probabilities are summed below
      for (int64_t t = 0; t < n; ++t) sum += sc[t];
      for (int64_t t = 0; t < n; ++t) sc[t] = sc[t] / sum;
    }
    for (int64_t j = 0; j < G; ++j) {
      float* o = p.out + (s * p.H + kvh * G + j) * D;
      for (int64_t d = 0; d < D; ++d) o[d] = 0.0f;
      const float* pr = buf.data() + j * n;
      for (int64_t t0 = 0; t0 < n; t0 += BS) {
        const float* vals = vbase + static_cast<int64_t>(table[t0 / BS]) * BS * D;
        for (int64_t t = t0; t < std::min(n, t0 + BS); ++t) {
          const float* val = vals + (t - t0) * D;
          const float pt = pr[t];
          for (int64_t d = 0; d < D; ++d) o[d] += pt * val[d];
        }
      }
    }
  }
}

}  // namespace DS_PDA_NS
}  // namespace ds::attention
