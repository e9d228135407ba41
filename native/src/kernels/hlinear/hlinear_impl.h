// y = x W^T (+ bias) with W fp16 or fp32, read straight from its stored elements: each vector of
// an fp16 W is converted to fp32 in registers (F16C's vcvtph2ps on AVX2 / AVX-512, bit arithmetic
// in the scalar variant) and multiplied in fp32 against fp32 x; an fp32 W is loaded as it is. A
// decode step is bound by the bytes of weight it reads, so reading fp16 (half of fp32's bytes) and
// converting for free is the point; torch's CPU fp16 matrix-vector product took as long as its
// fp32 one on the same shapes. For fp32 W the kernel reads W once, in place, where torch's GEMM
// at a few rows packs it first. The tiles are templates over the weight's element type.
// One ISA variant per file including this header with DS_HLIN_NS set (and DS_VEC_AVX512 or
// DS_VEC_AVX2 for the vector ones, read by common/vec_f32.h too); hlinear.cpp dispatches.
#pragma once

#include <algorithm>
#include <cstdint>

#include "../optim/half.h"
#include "hlinear_variants.h"

#include "../common/vec_f32.h"

namespace ds::hlinear {
namespace DS_HLIN_NS {
namespace {

using namespace ds::vec;  // W, V and the fp32 operations of this variant

// Weight vectors: W halves converted to fp32; single halves both ways (round to nearest even).
#if defined(DS_VEC_AVX512) || defined(DS_VEC_AVX2)
inline float h2f(uint16_t h) { return _cvtsh_ss(h); }
inline uint16_t f2h(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
inline V loadw(const uint16_t* p) {
#if defined(DS_VEC_AVX512)
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#else
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#endif
}
#else
inline float h2f(uint16_t h) { return ds::optim::f16_to_f32(h); }
inline uint16_t f2h(float f) { return ds::optim::f32_to_f16(f); }
inline V loadw(const uint16_t* p) { return h2f(*p); }
#endif
inline float h2f(float f) { return f; }
inline V loadw(const float* p) { return loadx(p); }

// Output rows per tile (rj) and rows of x per pass (up to 4): each converted weight vector feeds
// up to 4 rows of x, and the r * rj accumulator chains are independent. The accumulators, rj
// weight vectors and an x vector stay in registers: 16 + 4 + 1 of AVX-512's 32, 12 + 3 + 1 of
// AVX2's 16.
constexpr int kRj = W == 8 ? 3 : 4;
constexpr int kRows = 4;

// A decode step streams its weights from L3 or memory, and a tile reads its rows as rj short
// streams (a row of 576 halves is 18 cache lines) that the hardware prefetcher barely gets going
// on; as in the quantized linear (qlinear_impl.h), the same offset of the row about this many
// bytes ahead is prefetched into L2 while a row is read. SmolLM2-135M's 30 layers at one row,
// AVX-512 (tools/bench/half_linear.py): 27.4 ms without, 19.4-20.9 ms at 16 to 64 rows or 24 to
// 64 KB ahead (within the noise of one another).
constexpr int64_t kPrefetchBytes = 36 << 10;

inline void prefetch(const void* p) { __builtin_prefetch(p, 0, 2); }

template <typename T, int r, int rj>
inline void tile(const Args& a, int64_t i0, int64_t j, bool pf) {
  const int64_t k = a.k;
  const int64_t vec_end = k / W * W;
  // Whole rows ahead, so that the prefetch lands on the same offset of a later row.
  const int64_t ahead = std::max<int64_t>(1, kPrefetchBytes / (int64_t{sizeof(T)} * k)) * k;
  constexpr int64_t line = 64 / sizeof(T);  // elements per cache line
  const T* wr[rj];
  for (int u = 0; u < rj; ++u) wr[u] = static_cast<const T*>(a.w) + (j + u) * k;
  const float* x = a.x + i0 * k;
  float tail[r][rj] = {};  // the products past the last whole vector
  V acc[r][rj];
  for (auto& row : acc)
    for (V& v : row) v = zero();
  for (int64_t t = 0; t < vec_end; t += W) {
    // One prefetch per cache line of each row.
    if (pf && (t & (line - 1)) == 0)
      for (int u = 0; u < rj; ++u) prefetch(wr[u] + t + ahead);
    for (int u = 0; u < rj; ++u) {
      const V w = loadw(wr[u] + t);
      for (int q = 0; q < r; ++q) acc[q][u] = fma(w, loadx(x + q * k + t), acc[q][u]);
    }
  }
  for (int64_t t = vec_end; t < k; ++t)
    for (int u = 0; u < rj; ++u) {
      const float w = h2f(wr[u][t]);
      for (int q = 0; q < r; ++q) tail[q][u] += w * x[q * k + t];
    }
  for (int q = 0; q < r; ++q)
    for (int u = 0; u < rj; ++u) {
      const int64_t jj = j + u;
      float v = hsum(acc[q][u]) + tail[q][u];
      if (a.bias)
        v += a.bias_half ? h2f(static_cast<const uint16_t*>(a.bias)[jj])
                         : static_cast<const float*>(a.bias)[jj];
      const int64_t at = (i0 + q) * a.n + jj;
      if (a.y_half) {
        static_cast<uint16_t*>(a.y)[at] = f2h(v);
      } else {
        static_cast<float*>(a.y)[at] = v;
      }
    }
}

template <typename T, int rj>
inline void tile_rows(const Args& a, int64_t j) {
  // Prefetch only while the rows ahead exist (the next slice's rows, read by another thread or
  // later by this one, are as good a target as this slice's).
  constexpr int64_t s = sizeof(T);
  const bool pf = (j + rj) * a.k * s + kPrefetchBytes <= a.n * a.k * s;
  // Every block of rows of x within one tile, so that the tile's rows of W (rj * 2k bytes) are
  // read from memory once and from L1 for the blocks after the first.
  for (int64_t i0 = 0; i0 < a.m; i0 += kRows) {
    const bool p = pf && i0 == 0;
    switch (std::min<int64_t>(kRows, a.m - i0)) {
      case 1: tile<T, 1, rj>(a, i0, j, p); break;
      case 2: tile<T, 2, rj>(a, i0, j, p); break;
      case 3: tile<T, 3, rj>(a, i0, j, p); break;
      default: tile<T, 4, rj>(a, i0, j, p); break;
    }
  }
}

template <typename T>
void rows_of(const Args& a, int64_t j0, int64_t j1) {
  int64_t j = j0;
  for (; j + kRj <= j1; j += kRj) tile_rows<T, kRj>(a, j);
  for (; j < j1; ++j) tile_rows<T, 1>(a, j);
}

}  // namespace

// Output columns [j0, j1) of every row of y.
void rows(const Args& a, int64_t j0, int64_t j1) {
  if (a.w_half) {
    rows_of<uint16_t>(a, j0, j1);
  } else {
    rows_of<float>(a, j0, j1);
  }
}

void to_float(const uint16_t* h, int64_t count, float* out) {
  int64_t i = 0;
#if defined(DS_VEC_AVX512)
  for (; i + 16 <= count; i += 16) _mm512_storeu_ps(out + i, loadw(h + i));
#elif defined(DS_VEC_AVX2)
  for (; i + 8 <= count; i += 8) _mm256_storeu_ps(out + i, loadw(h + i));
#endif
  for (; i < count; ++i) out[i] = h2f(h[i]);
}

}  // namespace DS_HLIN_NS
}  // namespace ds::hlinear
