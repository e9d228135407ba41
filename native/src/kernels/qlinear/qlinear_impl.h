// y = x W^T + b with W stored group-wise quantized (int8 or int4, symmetric or asymmetric), read
// straight from its codes: no float copy of W is written. One ISA variant per file including this
// header with DS_QLIN_NS set (scalar, avx2, avx512); qlinear.cpp dispatches at run time.
//
// Each output row j of W has k/gs whole groups (the caller checks k % gs == 0, and gs even for
// int4). A group's contribution to y[i, j] is scale * (sum_t c_t x_t - z * sum_t x_t), c the
// codes and z the zero point (8 for int4_sym, 0 for int8_sym); the x group sums are computed
// once per call, and for int4 x is split into its even and odd elements once, so a byte's low
// nibble meets x_even and its high nibble x_odd.
#pragma once

#include <cstdint>

#include "ds/quant.h"

#if defined(DS_QLIN_AVX2) || defined(DS_QLIN_AVX512)
#include <immintrin.h>
#endif

namespace ds::quant {
namespace DS_QLIN_NS {
namespace {

#if defined(DS_QLIN_AVX512)
constexpr int W = 16;
using V = __m512;
inline V zero() { return _mm512_setzero_ps(); }
inline V loadx(const float* p) { return _mm512_loadu_ps(p); }
inline V codes_i8(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline __m512i bytes_u8(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline V to_f(__m512i v) { return _mm512_cvtepi32_ps(v); }
inline __m512i lo4(__m512i v) { return _mm512_and_si512(v, _mm512_set1_epi32(0xF)); }
inline __m512i hi4(__m512i v) { return _mm512_srli_epi32(v, 4); }
inline V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline V bcast(float s) { return _mm512_set1_ps(s); }
inline float hsum(V v) { return _mm512_reduce_add_ps(v); }
#elif defined(DS_QLIN_AVX2)
constexpr int W = 8;
using V = __m256;
inline V zero() { return _mm256_setzero_ps(); }
inline V loadx(const float* p) { return _mm256_loadu_ps(p); }
inline V codes_i8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline __m256i bytes_u8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline V to_f(__m256i v) { return _mm256_cvtepi32_ps(v); }
inline __m256i lo4(__m256i v) { return _mm256_and_si256(v, _mm256_set1_epi32(0xF)); }
inline __m256i hi4(__m256i v) { return _mm256_srli_epi32(v, 4); }
inline V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
inline V bcast(float s) { return _mm256_set1_ps(s); }
inline float hsum(V v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#else
constexpr int W = 1;
using V = float;
inline V zero() { return 0.0f; }
inline V loadx(const float* p) { return *p; }
inline V codes_i8(const uint8_t* p) { return static_cast<float>(static_cast<int8_t>(*p)); }
inline int32_t bytes_u8(const uint8_t* p) { return *p; }
inline V to_f(int32_t v) { return static_cast<float>(v); }
inline int32_t lo4(int32_t v) { return v & 0xF; }
inline int32_t hi4(int32_t v) { return v >> 4; }
inline V fma(V a, V b, V c) { return a * b + c; }
inline V bcast(float s) { return s; }
inline float hsum(V v) { return v; }
#endif

// Codes of one group for the int8 schemes: signed (sym) or unsigned (asym) bytes.
template <bool kSigned>
inline V load8(const uint8_t* p) {
  if constexpr (kSigned) {
    return codes_i8(p);
  } else {
    return to_f(bytes_u8(p));
  }
}

template <bool kSigned>
inline float code8(uint8_t b) {
  return kSigned ? static_cast<float>(static_cast<int8_t>(b)) : static_cast<float>(b);
}

// Output rows [j0, j1) for r (a compile-time count, so the accumulators stay in registers) rows
// of x; xs: per row of x, its k/gs group sums.
template <int kBits, bool kSigned, int r>
void rows(const float* x, const float* xe, const float* xo, const float* xs,
          int64_t k, const uint8_t* data, const float* scales, const float* zps, float zconst,
          int64_t gs, int64_t j0, int64_t j1, float* y, int64_t ldy) {
  const int64_t gpr = k / gs;                          // groups per row of W
  const int64_t bpg = kBits == 4 ? gs / 2 : gs;        // bytes per group
  const int64_t half = k / 2;
  for (int64_t j = j0; j < j1; ++j) {
    V acc[r];
    float corr[r];
    for (int q = 0; q < r; ++q) {
      acc[q] = zero();
      corr[q] = 0.0f;
    }
    for (int64_t g = 0; g < gpr; ++g) {
      const int64_t gi = j * gpr + g;
      const uint8_t* c = data + gi * bpg;
      const float scale = scales[gi];
      const float z = zps ? zps[gi] : zconst;
      V part[r];
      float tail[r];
      for (int q = 0; q < r; ++q) {
        part[q] = zero();
        tail[q] = 0.0f;
      }
      if constexpr (kBits == 8) {
        const int64_t base = g * gs;
        int64_t t = 0;
        for (; t + W <= gs; t += W) {
          const V w = load8<kSigned>(c + t);
          for (int q = 0; q < r; ++q) part[q] = fma(w, loadx(x + q * k + base + t), part[q]);
        }
        for (; t < gs; ++t) {
          const float w = code8<kSigned>(c[t]);
          for (int q = 0; q < r; ++q) tail[q] += w * x[q * k + base + t];
        }
      } else {
        const int64_t base = g * (gs / 2);  // the group's offset in x_even / x_odd
        int64_t t = 0;
        for (; t + W <= bpg; t += W) {
          const auto b = bytes_u8(c + t);
          const V lo = to_f(lo4(b));
          const V hi = to_f(hi4(b));
          for (int q = 0; q < r; ++q) {
            part[q] = fma(lo, loadx(xe + q * half + base + t), part[q]);
            part[q] = fma(hi, loadx(xo + q * half + base + t), part[q]);
          }
        }
        for (; t < bpg; ++t) {
          const float lo = static_cast<float>(c[t] & 0xF);
          const float hi = static_cast<float>(c[t] >> 4);
          for (int q = 0; q < r; ++q) {
            tail[q] += lo * xe[q * half + base + t];
            tail[q] += hi * xo[q * half + base + t];
          }
        }
      }
      const V sv = bcast(scale);
      for (int q = 0; q < r; ++q) {
        acc[q] = fma(part[q], sv, acc[q]);
        corr[q] += scale * (tail[q] - z * xs[q * gpr + g]);
      }
    }
    for (int q = 0; q < r; ++q) y[q * ldy + j] = hsum(acc[q]) + corr[q];
  }
}

template <int r>
void rows_of(const float* x, const float* xe, const float* xo, const float* xs, int64_t k,
             const uint8_t* data, const float* scales, const float* zps, int64_t gs,
             const IntScheme& s, int64_t j0, int64_t j1, float* y, int64_t ldy) {
  const float zconst = (s.bits == 4 && !s.asym) ? 8.0f : 0.0f;
  if (s.bits == 8) {
    if (s.asym) {
      rows<8, false, r>(x, xe, xo, xs, k, data, scales, zps, zconst, gs, j0, j1, y, ldy);
    } else {
      rows<8, true, r>(x, xe, xo, xs, k, data, scales, nullptr, zconst, gs, j0, j1, y, ldy);
    }
  } else {
    rows<4, false, r>(x, xe, xo, xs, k, data, scales, s.asym ? zps : nullptr, zconst, gs, j0,
                      j1, y, ldy);
  }
}

}  // namespace

// Rows [i0, i0 + r) of x (1 <= r <= 4) against output rows [j0, j1) of W.
void qlinear_rows(const float* x, const float* xe, const float* xo, const float* xs, int64_t r,
                  int64_t k, const uint8_t* data, const float* scales, const float* zps,
                  int64_t gs, const IntScheme& s, int64_t j0, int64_t j1, float* y, int64_t ldy) {
  switch (r) {
    case 1: return rows_of<1>(x, xe, xo, xs, k, data, scales, zps, gs, s, j0, j1, y, ldy);
    case 2: return rows_of<2>(x, xe, xo, xs, k, data, scales, zps, gs, s, j0, j1, y, ldy);
    case 3: return rows_of<3>(x, xe, xo, xs, k, data, scales, zps, gs, s, j0, j1, y, ldy);
    default: return rows_of<4>(x, xe, xo, xs, k, data, scales, zps, gs, s, j0, j1, y, ldy);
  }
}

}  // namespace DS_QLIN_NS
}  // namespace ds::quant
