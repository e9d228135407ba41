// y = x W^T + b with W stored group-wise quantized (int8 or int4, symmetric or asymmetric), read
// straight from its codes: no float copy of W is written. One ISA variant per file including this
// header with DS_QLIN_NS set (scalar, avx2, avx512); qlinear.cpp dispatches at run time.
//
// Each output row j of W has k/gs whole groups (the caller checks k % gs == 0, and gs even for
// int4). A group's contribution to y[i, j] is scale * (sum_t c_t x_t - z * sum_t x_t), c the
// codes and z the zero point (8 for int4_sym, 0 for int8_sym); the x group sums are computed
// once per call, and for int4 x is split into its even and odd elements once, so a byte's low
// nibble meets x_even and its high nibble x_odd. Several output rows are computed per pass (kRj)
// so that the accumulations do not wait on one another.
//
// All arithmetic is fp32 on the float activations, to stay within the tests' float64-reference
// bound (1e-6 of sum |x||w|). Quantizing x to 8 bits per block and multiplying int8 by int8, as
// llama.cpp's Q8_0 does, would cut the work per code but err by up to about max|x| / 254 per
// element, thousands of times that bound: that is the opt-in linear_int_a8 (qlinear_a8_impl.h).
#pragma once

#include <algorithm>
#include <cstdint>

#include "ds/quant.h"

#if defined(DS_QLIN_AVX512)
#define DS_VEC_AVX512 1
#elif defined(DS_QLIN_AVX2)
#define DS_VEC_AVX2 1
#endif
#include "../common/vec_f32.h"

namespace ds::quant {
namespace DS_QLIN_NS {
namespace {

using namespace ds::vec;  // W, V and the fp32 operations of this variant

#if defined(DS_QLIN_AVX512)
inline V codes_i8(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline __m512i bytes_u8(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline V to_f(__m512i v) { return _mm512_cvtepi32_ps(v); }
inline __m512i lo4(__m512i v) { return _mm512_and_si512(v, _mm512_set1_epi32(0xF)); }
inline __m512i hi4(__m512i v) { return _mm512_srli_epi32(v, 4); }
// 4-bit codes to floats by a 16-entry table lookup (vpermps reads the low 4 bits of each index):
// it runs on the shuffle port, where a conversion would compete with the FMAs for theirs, and
// the table can hold the code minus int4_sym's zero point 8, so that scheme needs no correction.
constexpr bool kTable4 = true;
inline V table4(float off) {
  const V i = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  return _mm512_sub_ps(i, _mm512_set1_ps(off));
}
inline V nib_lo(__m512i b, V table) { return _mm512_permutexvar_ps(b, table); }
inline V nib_hi(__m512i b, V table) { return _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), table); }
#elif defined(DS_QLIN_AVX2)
inline V codes_i8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline __m256i bytes_u8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline V to_f(__m256i v) { return _mm256_cvtepi32_ps(v); }
inline __m256i lo4(__m256i v) { return _mm256_and_si256(v, _mm256_set1_epi32(0xF)); }
inline __m256i hi4(__m256i v) { return _mm256_srli_epi32(v, 4); }
#else
inline V codes_i8(const uint8_t* p) { return static_cast<float>(static_cast<int8_t>(*p)); }
inline int32_t bytes_u8(const uint8_t* p) { return *p; }
inline V to_f(int32_t v) { return static_cast<float>(v); }
inline int32_t lo4(int32_t v) { return v & 0xF; }
inline int32_t hi4(int32_t v) { return v >> 4; }
#endif

#if !defined(DS_QLIN_AVX512)
// 4-bit codes to floats by conversion (a 16-entry table needs two lookups at 8 lanes).
constexpr bool kTable4 = false;
inline V table4(float) { return zero(); }
inline V nib_lo(decltype(bytes_u8(nullptr)) b, V) { return to_f(lo4(b)); }
inline V nib_hi(decltype(bytes_u8(nullptr)) b, V) { return to_f(hi4(b)); }
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

// Output rows computed together per pass for r rows of x. Each weight vector converted to float
// then feeds r rows of x, each x vector kRj output rows, and the r * kRj accumulator chains are
// independent, so the FMA latency (4 cycles a group per chain with one row) is hidden. Bounded so
// that the accumulators (two vectors a pair: the running sum and the current group's) stay in
// registers (32 zmm for AVX-512, 16 ymm for AVX2 and the scalar variant), and by 4: on 30 layers'
// weights streamed from L3 (a decode step), 4 rows took 7.3 ms at int4 where 8 took 8.0 (int8
// 11.9 against 12.1), fewer short streams for the prefetches below.
template <int r>
constexpr int kRj = std::max(1, std::min(4, (W == 16 ? 24 : 12) / (2 * r)));

// A decode step's weights (100 MB at int8 for SmolLM2-135M) come from L3 or memory, and a tile
// reads its rows as several short streams (a row of 576 codes is 9 cache lines) that the
// hardware prefetcher barely starts on before they end: measured over 30 layers' weights, the
// step took 1.6x its time on cache-resident weights. So each group's codes (and each row's
// scales) are prefetched this many rows ahead, the same group of later rows (weights are stored
// row after row), into L2 rather than L1 (hint 2): 30 layers at int8 took 11.8-12.4 ms against
// 12.7 with 16 rows into L1 (three runs each, alternated), int4 8.0 against 8.0-8.2.
constexpr int64_t kPrefetchRows = 32;

inline void prefetch(const void* p, int64_t ahead, const void* end) {
  // Integer arithmetic: a pointer past the end of an array would be undefined even unread.
  const uintptr_t at = reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(ahead);
  if (at < reinterpret_cast<uintptr_t>(end))
    __builtin_prefetch(reinterpret_cast<const void*>(at), 0, 2);
}

struct Args {
  const float* x;   // r rows of k
  const float* xe;  // 4 bits: x's even elements, r rows of k / 2
  const float* xo;  // 4 bits: x's odd elements
  const float* xs;  // per row of x its k / gs group sums (read only with zero points)
  int64_t k;
  const uint8_t* data;
  const uint8_t* data_end;  // one past the last code byte (bounds the prefetches)
  const float* scales;
  const float* scales_end;  // one past the last scale read
  const float* zps;  // per group zero points (asymmetric schemes), else null
  float zconst;      // the zero point of every group when zps is null
  int64_t gs;
  float* y;  // y[q * ldy + j]
  int64_t ldy;
};

// y for output rows [j, j + rj) and r rows of x. kZero: the groups have a nonzero zero point z,
// whose term scale * z * sum(x of the group) is subtracted once per group, not per element
// (symmetric int8 has none and skips it). kSigned: int8 codes are signed bytes; 4-bit codes are
// decoded as code - 8 by the table (int4_sym where kTable4).
template <int kBits, bool kSigned, bool kZero, int r, int rj, int kGs>
inline void tile(const Args& a, int64_t j) {
  const int64_t gs = kGs ? kGs : a.gs;  // a compile-time group size unrolls the loops below
  const int64_t gpr = a.k / gs;                          // groups per row of W
  const int64_t bpg = kBits == 4 ? gs / 2 : gs;          // bytes per group
  const int64_t vec_end = bpg / W * W;
  const int64_t end = bpg;
  const bool scalar_tail = vec_end < end;  // a group is not a whole number of vectors
  const int64_t half = a.k / 2;
  const V tbl = table4(kSigned ? 8.0f : 0.0f);
  const int64_t ahead = kPrefetchRows * gpr * bpg;
  // The scales of the rows as far ahead (a row's are gpr floats, one or a few cache lines).
  for (int u = 0; u < rj; ++u)
    for (int64_t at = 0; at < gpr; at += 64 / static_cast<int64_t>(sizeof(float)))
      prefetch(a.scales + (j + u) * gpr + at, kPrefetchRows * gpr * 4, a.scales_end);
  V acc[r][rj];
  float corr[r][rj];
  for (int q = 0; q < r; ++q)
    for (int u = 0; u < rj; ++u) {
      acc[q][u] = zero();
      corr[q][u] = 0.0f;
    }
  for (int64_t g = 0; g < gpr; ++g) {
    V part[r][rj];
    float tail[r][rj];
    for (int q = 0; q < r; ++q)
      for (int u = 0; u < rj; ++u) {
        part[q][u] = zero();
        tail[q][u] = 0.0f;
      }
    const uint8_t* c[rj];
    for (int u = 0; u < rj; ++u) c[u] = a.data + ((j + u) * gpr + g) * bpg;
    for (int u = 0; u < rj; ++u) prefetch(c[u], ahead, a.data_end);
    if constexpr (kBits == 8) {
      const float* xg = a.x + g * gs;
      for (int64_t t = 0; t < vec_end; t += W)
        for (int u = 0; u < rj; ++u) {
          const V w = load8<kSigned>(c[u] + t);
          for (int q = 0; q < r; ++q) part[q][u] = fma(w, loadx(xg + q * a.k + t), part[q][u]);
        }
      for (int64_t t = vec_end; t < end; ++t)
        for (int u = 0; u < rj; ++u)
          for (int q = 0; q < r; ++q) tail[q][u] += code8<kSigned>(c[u][t]) * xg[q * a.k + t];
    } else {
      const float* xe = a.xe + g * bpg;  // the group's offset in x_even / x_odd
      const float* xo = a.xo + g * bpg;
      constexpr int off = kSigned ? 8 : 0;
      for (int64_t t = 0; t < vec_end; t += W)
        for (int u = 0; u < rj; ++u) {
          const auto b = bytes_u8(c[u] + t);
          const V lo = nib_lo(b, tbl);
          const V hi = nib_hi(b, tbl);
          for (int q = 0; q < r; ++q) {
            part[q][u] = fma(lo, loadx(xe + q * half + t), part[q][u]);
            part[q][u] = fma(hi, loadx(xo + q * half + t), part[q][u]);
          }
        }
      for (int64_t t = vec_end; t < end; ++t)
        for (int u = 0; u < rj; ++u)
          for (int q = 0; q < r; ++q) {
            tail[q][u] += static_cast<float>((c[u][t] & 0xF) - off) * xe[q * half + t];
            tail[q][u] += static_cast<float>((c[u][t] >> 4) - off) * xo[q * half + t];
          }
    }
    for (int u = 0; u < rj; ++u) {
      const int64_t gi = (j + u) * gpr + g;
      const V sv = bcast(a.scales[gi]);
      for (int q = 0; q < r; ++q) acc[q][u] = fma(part[q][u], sv, acc[q][u]);
    }
    if (kZero || scalar_tail)
      for (int u = 0; u < rj; ++u) {
        const int64_t gi = (j + u) * gpr + g;
        const float z = kZero ? (a.zps ? a.zps[gi] : a.zconst) : 0.0f;
        for (int q = 0; q < r; ++q)
          corr[q][u] += a.scales[gi] * (tail[q][u] - (kZero ? z * a.xs[q * gpr + g] : 0.0f));
      }
  }
  for (int q = 0; q < r; ++q)
    for (int u = 0; u < rj; ++u) a.y[q * a.ldy + j + u] = hsum(acc[q][u]) + corr[q][u];
}

template <int kBits, bool kSigned, bool kZero, int r, int kGs>
void rows_gs(const Args& a, int64_t j0, int64_t j1) {
  constexpr int rj = kRj<r>;
  int64_t j = j0;
  for (; j + rj <= j1; j += rj) tile<kBits, kSigned, kZero, r, rj, kGs>(a, j);
  for (; j < j1; ++j) tile<kBits, kSigned, kZero, r, 1, kGs>(a, j);
}

// Group size 32 (GGUF's Q8_0/Q4_0 blocks, ds's default) gets its own code.
template <int kBits, bool kSigned, bool kZero, int r>
void rows(const Args& a, int64_t j0, int64_t j1) {
  if (a.gs == 32) {
    rows_gs<kBits, kSigned, kZero, r, 32>(a, j0, j1);
  } else {
    rows_gs<kBits, kSigned, kZero, r, 0>(a, j0, j1);
  }
}

template <int r>
void rows_of(const Args& a, const IntScheme& s, int64_t j0, int64_t j1) {
  if (s.bits == 8) {
    if (s.asym) {
      rows<8, false, true, r>(a, j0, j1);
    } else {
      rows<8, true, false, r>(a, j0, j1);
    }
  } else if (kTable4 && !s.asym) {
    rows<4, true, false, r>(a, j0, j1);  // int4_sym, the zero point 8 in the table
  } else {
    rows<4, false, true, r>(a, j0, j1);  // codes 0..15 around a zero point (8 for int4_sym)
  }
}

}  // namespace

// Rows [i0, i0 + r) of x (1 <= r <= 4) against output rows [j0, j1) of W.
void qlinear_rows(const float* x, const float* xe, const float* xo, const float* xs, int64_t r,
                  int64_t k, const uint8_t* data, const float* scales, const float* zps,
                  int64_t gs, const IntScheme& s, int64_t j0, int64_t j1, float* y, int64_t ldy) {
  const float zconst = (s.bits == 4 && !s.asym) ? 8.0f : 0.0f;
  const int64_t gpr = k / gs;
  const int64_t bytes = j1 * gpr * (s.bits == 4 ? gs / 2 : gs);  // the codes through row j1
  const Args a{x, xe, xo, xs, k, data, data + bytes, scales, scales + j1 * gpr,
               s.asym ? zps : nullptr, zconst, gs, y, ldy};
  switch (r) {
    case 1: return rows_of<1>(a, s, j0, j1);
    case 2: return rows_of<2>(a, s, j0, j1);
    case 3: return rows_of<3>(a, s, j0, j1);
    default: return rows_of<4>(a, s, j0, j1);
  }
}

}  // namespace DS_QLIN_NS
}  // namespace ds::quant
