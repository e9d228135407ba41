// y = x W^T for W stored int8_sym / int4_sym group-wise, with x quantized to int8 per block of
// one group (qlinear_a8.cpp): each group's contribution is an exact int32 dot product of codes
// times ws * sa, the weight and activation scales, summed in fp32. One ISA variant per file
// including this header with DS_QA8_NS set: avx512vnni (vpdpbusd on 64 bytes), avxvnni (vpdpbusd
// on 32), avx2 (vpmaddubsw + vpmaddwd) and scalar.
//
// The vector instructions multiply unsigned by signed bytes. int4 codes are unsigned nibbles
// already (their zero point 8 comes back as -8 times the activations they meet); int8 codes are
// signed, so VNNI reads them offset by 128 (a sign flip of the top bit) and takes back 128 times
// the activations. Both corrections are the int32 each lane's sum starts from (A8Args::corr).
// vpmaddubsw sums pairs into int16 with saturation, which 255 * 127 * 2 would reach, so the AVX2
// variant multiplies |w| by x carrying w's sign instead (at most 2 * 127 * 127) and needs no
// correction for int8.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "qlinear_a8.h"

#if !defined(DS_QA8_SCALAR)
#include <immintrin.h>
#endif

namespace ds::quant {
namespace DS_QA8_NS {
namespace {

#if defined(DS_QA8_SCALAR)

// The reference order: per group an exact int32 sum of (code - zero point) * activation code.
void rows(const A8Args& a, int64_t j0, int64_t j1) {
  const int64_t gpr = a.k / a.gs;
  const int64_t bpg = a.bits == 8 ? a.gs : a.gs / 2;
  for (int64_t j = j0; j < j1; ++j)
    for (int64_t q = 0; q < a.m; ++q) {
      float acc = 0.0f;
      for (int64_t g = 0; g < gpr; ++g) {
        const uint8_t* c = a.data + j * a.kcode + g * bpg;
        const int8_t* xe = a.xq + q * a.kcp + g * bpg;
        const int8_t* xo = a.xo ? a.xo + q * a.kcp + g * bpg : nullptr;
        int32_t dot = 0;
        for (int64_t t = 0; t < bpg; ++t) {
          if (a.bits == 8) {
            dot += static_cast<int8_t>(c[t]) * xe[t];
          } else {
            dot += ((c[t] & 0xF) - 8) * xe[t] + ((c[t] >> 4) - 8) * xo[t];
          }
        }
        acc += static_cast<float>(dot) * (a.scales[j * gpr + g] * a.sa[q * gpr + g]);
      }
      a.y[q * a.ldy + j] = acc;
    }
}

#else

#if defined(DS_QA8_AVX512VNNI)
constexpr int L = 16;  // int32 lanes of a vector (64 code bytes)
using VI = __m512i;
using VF = __m512;
inline VI loadi(const void* p) { return _mm512_loadu_si512(p); }
inline VF loadf(const float* p) { return _mm512_loadu_ps(p); }
inline VI izero() { return _mm512_setzero_si512(); }
inline VI isub(VI a, VI b) { return _mm512_sub_epi32(a, b); }
inline VI codes(const uint8_t* p, int64_t bytes) {  // bytes <= 64; the rest zero
  const __mmask64 mk = bytes >= 64 ? ~__mmask64{0} : ((__mmask64{1} << bytes) - 1);
  return _mm512_maskz_loadu_epi8(mk, p);
}
inline VI bytes8(int v) { return _mm512_set1_epi8(static_cast<char>(v)); }
inline VI band(VI a, VI b) { return _mm512_and_si512(a, b); }
inline VI shr4(VI a) { return _mm512_srli_epi16(a, 4); }
inline VI prep8(VI w) { return _mm512_xor_si512(w, bytes8(0x80)); }  // code + 128, unsigned
inline VI dot8(VI acc, VI w, VI x) { return _mm512_dpbusd_epi32(acc, w, x); }
constexpr bool kOffset8 = true;  // int8 codes read as code + 128
inline VI dot4(VI acc, VI lo, VI hi, VI xe, VI xo) {
  return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acc, lo, xe), hi, xo);
}
inline VF cvt(VI v) { return _mm512_cvtepi32_ps(v); }
inline VF zero() { return _mm512_setzero_ps(); }
inline VF mul(VF a, VF b) { return _mm512_mul_ps(a, b); }
inline VF fma(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
inline float hsum(VF v) { return _mm512_reduce_add_ps(v); }
// A chunk's lanes meet at most 4 groups of a row (gs >= 32): their scales are loaded once and
// spread over the lanes by a permutation with the lanes' group offsets.
struct Spread {
  VI rel;
  __mmask16 mask;
};
inline Spread spread(const int32_t* lg) {
  const int32_t g0 = lg[0];
  const int n = lg[L - 1] - g0 + 1;
  return {_mm512_sub_epi32(loadi(lg), _mm512_set1_epi32(g0)),
          static_cast<__mmask16>((1u << n) - 1)};
}
inline VF lane_scales(const float* s, const Spread& sp) {
  return _mm512_permutexvar_ps(sp.rel, _mm512_maskz_loadu_ps(sp.mask, s));
}
#else  // the AVX2 family: 8 lanes, 32 code bytes
constexpr int L = 8;
using VI = __m256i;
using VF = __m256;
inline VI loadi(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline VF loadf(const float* p) { return _mm256_loadu_ps(p); }
inline VI izero() { return _mm256_setzero_si256(); }
inline VI isub(VI a, VI b) { return _mm256_sub_epi32(a, b); }
inline VI codes(const uint8_t* p, int64_t bytes) {  // 32, or 16 (an int4 row's last group)
  if (bytes >= 32) return loadi(p);
  return _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline VI bytes8(int v) { return _mm256_set1_epi8(static_cast<char>(v)); }
inline VI band(VI a, VI b) { return _mm256_and_si256(a, b); }
inline VI shr4(VI a) { return _mm256_srli_epi16(a, 4); }
#if defined(DS_QA8_AVXVNNI)
inline VI prep8(VI w) { return _mm256_xor_si256(w, bytes8(0x80)); }
inline VI dot8(VI acc, VI w, VI x) { return _mm256_dpbusd_avx_epi32(acc, w, x); }
constexpr bool kOffset8 = true;
inline VI dot4(VI acc, VI lo, VI hi, VI xe, VI xo) {
  return _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(acc, lo, xe), hi, xo);
}
#else
inline VI pairs(VI p16) { return _mm256_madd_epi16(p16, _mm256_set1_epi16(1)); }
inline VI prep8(VI w) { return w; }
constexpr bool kOffset8 = false;  // int8 codes read as |code| against x carrying their sign
inline VI dot8(VI acc, VI w, VI x) {
  return _mm256_add_epi32(acc, pairs(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w),
                                                          _mm256_sign_epi8(x, w))));
}
inline VI dot4(VI acc, VI lo, VI hi, VI xe, VI xo) {  // 4 * 15 * 127 fits int16
  return _mm256_add_epi32(acc, pairs(_mm256_add_epi16(_mm256_maddubs_epi16(lo, xe),
                                                      _mm256_maddubs_epi16(hi, xo))));
}
#endif
inline VF cvt(VI v) { return _mm256_cvtepi32_ps(v); }
inline VF zero() { return _mm256_setzero_ps(); }
inline VF mul(VF a, VF b) { return _mm256_mul_ps(a, b); }
inline VF fma(VF a, VF b, VF c) { return _mm256_fmadd_ps(a, b, c); }
inline float hsum(VF v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
struct Spread {  // at most 2 groups per chunk
  VI rel;
  VI mask;
};
inline Spread spread(const int32_t* lg) {
  const int32_t g0 = lg[0];
  const int n = lg[L - 1] - g0 + 1;
  return {_mm256_sub_epi32(loadi(lg), _mm256_set1_epi32(g0)),
          _mm256_setr_epi32(-1, n > 1 ? -1 : 0, 0, 0, 0, 0, 0, 0)};
}
inline VF lane_scales(const float* s, const Spread& sp) {
  return _mm256_permutevar8x32_ps(_mm256_maskload_ps(s, sp.mask), sp.rel);
}
#endif

constexpr int64_t kChunk = 4 * L;  // code bytes per vector
// Rows of x per pass and output rows per tile: the r * rj accumulators, rj weight vectors (two
// for int4) and their lane scales stay in registers (32 zmm, 16 ymm).
constexpr int kR = 4;
constexpr int kRj = L == 16 ? 4 : 2;
// Each tile's weights are read by every pass over the rows of x from L1; the first pass brings
// them in and prefetches the rows this far ahead into L2 (weights are stored row after row), as
// the float kernel does (qlinear_impl.h).
constexpr int64_t kPrefetchRows = 32;

inline void prefetch(const void* p, int64_t ahead, const void* end) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(ahead);
  if (at < reinterpret_cast<uintptr_t>(end))
    __builtin_prefetch(reinterpret_cast<const void*>(at), 0, 2);
}

// Output rows [j, j + rj) for rows [q0, q0 + r) of x.
template <int kBits, int r, int rj>
void tile(const A8Args& a, int64_t j, int64_t q0) {
  const int64_t gpr = a.k / a.gs;
  const uint8_t* w[rj];
  const float* ws[rj];
  for (int u = 0; u < rj; ++u) {
    w[u] = a.data + (j + u) * a.kcode;
    ws[u] = a.scales + (j + u) * gpr;
  }
  if (q0 == 0)
    for (int u = 0; u < rj; ++u)
      for (int64_t at = 0; at < gpr; at += 16)
        prefetch(ws[u] + at, kPrefetchRows * gpr * 4, a.scales_end);
  VF acc[r][rj];
  for (int q = 0; q < r; ++q)
    for (int u = 0; u < rj; ++u) acc[q][u] = zero();
  for (int64_t c = 0; c < a.kcode; c += kChunk) {
    const int64_t bytes = std::min(kChunk, a.kcode - c);
    const int32_t* lg = a.lane_g + c / 4;
    const Spread sp = spread(lg);
    if (q0 == 0)
      for (int u = 0; u < rj; ++u) prefetch(w[u] + c, kPrefetchRows * a.kcode, a.data_end);
    VI lo[rj], hi[rj];
    VF su[rj];
    for (int u = 0; u < rj; ++u) {
      const VI raw = codes(w[u] + c, bytes);
      if constexpr (kBits == 8) {
        lo[u] = prep8(raw);
      } else {
        lo[u] = band(raw, bytes8(0x0F));
        hi[u] = band(shr4(raw), bytes8(0x0F));
      }
      su[u] = lane_scales(ws[u] + lg[0], sp);
    }
    for (int q = 0; q < r; ++q) {
      const int64_t row = q0 + q;
      const VF sal = lane_scales(a.sa + row * gpr + lg[0], sp);
      const VI xe = loadi(a.xq + row * a.kcp + c);
      // Each lane's sum starts from minus the zero point the unsigned operand carries times
      // the activations it meets.
      if constexpr (kBits == 8) {
        const VI corr = kOffset8 ? isub(izero(), dot8(izero(), bytes8(0x80), xe)) : izero();
        for (int u = 0; u < rj; ++u)
          acc[q][u] = fma(cvt(dot8(corr, lo[u], xe)), mul(su[u], sal), acc[q][u]);
      } else {
        const VI xo = loadi(a.xo + row * a.kcp + c);
        const VI corr = isub(izero(), dot4(izero(), bytes8(8), bytes8(8), xe, xo));
        for (int u = 0; u < rj; ++u)
          acc[q][u] = fma(cvt(dot4(corr, lo[u], hi[u], xe, xo)), mul(su[u], sal), acc[q][u]);
      }
    }
  }
  for (int q = 0; q < r; ++q)
    for (int u = 0; u < rj; ++u) a.y[(q0 + q) * a.ldy + j + u] = hsum(acc[q][u]);
}

// Every row of x against output rows [j, j + rj): the tile's weights stay in L1 across passes.
template <int kBits, int rj>
void passes(const A8Args& a, int64_t j) {
  int64_t q0 = 0;
  for (; q0 + kR <= a.m; q0 += kR) tile<kBits, kR, rj>(a, j, q0);
  switch (a.m - q0) {
    case 1: return tile<kBits, 1, rj>(a, j, q0);
    case 2: return tile<kBits, 2, rj>(a, j, q0);
    case 3: return tile<kBits, 3, rj>(a, j, q0);
    default: return;
  }
}

template <int kBits>
void rows_bits(const A8Args& a, int64_t j0, int64_t j1) {
  int64_t j = j0;
  for (; j + kRj <= j1; j += kRj) passes<kBits, kRj>(a, j);
  for (; j < j1; ++j) passes<kBits, 1>(a, j);
}

void rows(const A8Args& a, int64_t j0, int64_t j1) {
  if (a.bits == 8) {
    rows_bits<8>(a, j0, j1);
  } else {
    rows_bits<4>(a, j0, j1);
  }
}

#endif

// Rounds to the nearest integer, ties to even, as torch.round does (|v| <= 127 here): adding
// 1.5 * 2^23 leaves no fraction bits, and the default rounding mode picks the even neighbour.
inline float round_even(float v) { return (v + 12582912.0f) - 12582912.0f; }

}  // namespace

// Written so that the compiler vectorizes it with the variant's ISA (a decode step quantizes
// every layer's input: scalar code took longer than the small layers' products). max|x| as the
// integer maximum of the sign-cleared bit patterns (their order is the magnitudes' order, and an
// integer reduction vectorizes where a float one would need -ffast-math).
void qa8_quantize(const float* x, int64_t n, int64_t block, int8_t* codes, float* scales) {
  for (int64_t b = 0; b * block < n; ++b) {
    const float* xb = x + b * block;
    uint32_t top = 0;
    for (int64_t t = 0; t < block; ++t) {
      uint32_t bits;
      std::memcpy(&bits, xb + t, sizeof bits);
      bits &= 0x7FFFFFFFu;
      top = bits > top ? bits : top;
    }
    float amax;
    std::memcpy(&amax, &top, sizeof amax);
    scales[b] = amax / 127.0f;
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t t = 0; t < block; ++t) {
      float v = round_even(xb[t] * inv);
      v = v < -127.0f ? -127.0f : v;
      v = v > 127.0f ? 127.0f : v;
      codes[b * block + t] = static_cast<int8_t>(static_cast<int32_t>(v));
    }
  }
}

void qa8_rows(const A8Args& a, int64_t j0, int64_t j1) { rows(a, j0, j1); }

}  // namespace DS_QA8_NS
}  // namespace ds::quant
