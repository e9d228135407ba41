// y = x W^T for W stored int8_sym / int4_sym group-wise, with x quantized to int8 per block of
// one group (qlinear_a8.cpp): each group's contribution is an exact int32 dot product of codes
// times ws * sa, the weight and activation scales, summed in fp32. One ISA variant per file
// including this header with DS_QA8_NS set: avx512vnni (vpdpbusd, 16 int32 lanes), avxvnni
// (vpdpbusd, 8), avx2 (vpmaddubsw + vpmaddwd, 8) and scalar.
//
// The weight is packed (A8Packed, ds/quant.h): a vector holds 4 code bytes of each of 16 output
// rows, and the 4 activation codes they meet are broadcast to every lane, so each lane sums one
// output row's group and the group's scales are applied as one vector per 16 rows (x is read as
// broadcasts, the weight as whole vectors). The vector instructions multiply unsigned by signed
// bytes: int4 nibbles are unsigned already (their zero point 8 is taken back by starting each
// group's sum from -8 times its activation codes' sum, computed once per call), int8 codes are
// signed, so the VNNI variants read the activations as code + 128 and start from the packed
// -128 * (the group's code sum). vpmaddubsw sums pairs into int16 with saturation, which
// 255 * 127 * 2 would reach, so the AVX2 variant multiplies |w| by x carrying w's sign instead
// (at most 2 * 128 * 127) and starts from 0.
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

constexpr int64_t kTile = 16;  // output rows per packed tile

#if defined(DS_QA8_SCALAR)

constexpr bool kOffset8 = false;

// The reference order: per group an exact int32 sum of (code - zero point) * activation code.
template <int kBits>
void packed_bits(const A8Packed& w, const A8Act& a, int64_t t0, int64_t t1) {
  constexpr int64_t S = kBits == 8 ? 8 : 4;
  const int64_t k = w.k, gpr = k / w.gs, bpg = w.gs / 32, blocks = k / 32;
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t r = 0; r < kTile && t * kTile + r < w.n; ++r)
      for (int64_t q = 0; q < a.m; ++q) {
        float acc = 0.0f;
        for (int64_t g = 0; g < gpr; ++g) {
          int32_t dot = 0;
          for (int64_t b = g * bpg; b < (g + 1) * bpg; ++b) {
            const uint8_t* wb = w.codes.data() + (t * blocks + b) * S * 64 + r * 4;
            const int8_t* xb = a.xq + q * k + b * 32;
            for (int64_t s = 0; s < S; ++s)
              for (int64_t i = 0; i < 4; ++i) {
                const uint8_t c = wb[s * 64 + i];
                if constexpr (kBits == 8) {
                  dot += static_cast<int8_t>(c) * xb[4 * s + i];
                } else {
                  dot += ((c & 0xF) - 8) * xb[4 * s + i] + ((c >> 4) - 8) * xb[16 + 4 * s + i];
                }
              }
          }
          acc += static_cast<float>(dot) * (w.scales[(t * gpr + g) * kTile + r] * a.sa[q * gpr + g]);
        }
        a.y[q * a.ldy + t * kTile + r] = acc;
      }
}

#else

#if defined(DS_QA8_AVX512VNNI)
constexpr int L = 16;  // int32 lanes: output rows per vector
using VI = __m512i;
using VF = __m512;
inline VI loadi(const void* p) { return _mm512_loadu_si512(p); }
inline VI seti(int32_t v) { return _mm512_set1_epi32(v); }
inline VI izero() { return _mm512_setzero_si512(); }
inline VI lo4(VI w) { return _mm512_and_si512(w, _mm512_set1_epi8(0x0F)); }
inline VI hi4(VI w) { return _mm512_and_si512(_mm512_srli_epi16(w, 4), _mm512_set1_epi8(0x0F)); }
constexpr bool kOffset8 = true;
inline VI prep8(VI w) { return w; }
inline VI dot8(VI acc, VI w, VI, VI x) { return _mm512_dpbusd_epi32(acc, x, w); }
inline VI dot4(VI acc, VI lo, VI hi, VI xl, VI xh) {
  return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acc, lo, xl), hi, xh);
}
inline VF loadf(const float* p) { return _mm512_loadu_ps(p); }
inline VF setf(float v) { return _mm512_set1_ps(v); }
inline VF fzero() { return _mm512_setzero_ps(); }
inline VF cvt(VI v) { return _mm512_cvtepi32_ps(v); }
inline VF mul(VF a, VF b) { return _mm512_mul_ps(a, b); }
inline VF fma(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
inline void store(float* y, VF v, int rows) {
  _mm512_mask_storeu_ps(y, static_cast<__mmask16>((1u << rows) - 1), v);
}
#else  // the AVX2 family: 8 lanes, a tile in two halves
constexpr int L = 8;
using VI = __m256i;
using VF = __m256;
inline VI loadi(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline VI seti(int32_t v) { return _mm256_set1_epi32(v); }
inline VI izero() { return _mm256_setzero_si256(); }
inline VI lo4(VI w) { return _mm256_and_si256(w, _mm256_set1_epi8(0x0F)); }
inline VI hi4(VI w) { return _mm256_and_si256(_mm256_srli_epi16(w, 4), _mm256_set1_epi8(0x0F)); }
#if defined(DS_QA8_AVXVNNI)
constexpr bool kOffset8 = true;
inline VI prep8(VI w) { return w; }
inline VI dot8(VI acc, VI w, VI, VI x) { return _mm256_dpbusd_avx_epi32(acc, x, w); }
inline VI dot4(VI acc, VI lo, VI hi, VI xl, VI xh) {
  return _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(acc, lo, xl), hi, xh);
}
#else
constexpr bool kOffset8 = false;
inline VI pairs(VI p16) { return _mm256_madd_epi16(p16, _mm256_set1_epi16(1)); }
inline VI prep8(VI w) { return _mm256_abs_epi8(w); }
inline VI dot8(VI acc, VI w, VI wabs, VI x) {
  return _mm256_add_epi32(acc, pairs(_mm256_maddubs_epi16(wabs, _mm256_sign_epi8(x, w))));
}
inline VI dot4(VI acc, VI lo, VI hi, VI xl, VI xh) {  // 4 * 15 * 127 fits int16
  return _mm256_add_epi32(acc, pairs(_mm256_add_epi16(_mm256_maddubs_epi16(lo, xl),
                                                      _mm256_maddubs_epi16(hi, xh))));
}
#endif
inline VF loadf(const float* p) { return _mm256_loadu_ps(p); }
inline VF setf(float v) { return _mm256_set1_ps(v); }
inline VF fzero() { return _mm256_setzero_ps(); }
inline VF cvt(VI v) { return _mm256_cvtepi32_ps(v); }
inline VF mul(VF a, VF b) { return _mm256_mul_ps(a, b); }
inline VF fma(VF a, VF b, VF c) { return _mm256_fmadd_ps(a, b, c); }
inline void store(float* y, VF v, int rows) {
  if (rows == L) return _mm256_storeu_ps(y, v);
  alignas(32) float tmp[L];
  _mm256_store_ps(tmp, v);
  std::memcpy(y, tmp, sizeof(float) * static_cast<size_t>(rows));
}
#endif

inline VI bcast4(const int8_t* p) {  // 4 activation codes, to every lane
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return seti(v);
}

// Rows of x per pass: r int32 sums and r fp32 accumulators stay in registers (32 zmm, 16 ymm);
// the tile's codes are read from L1 again by each further pass.
constexpr int kR = L == 16 ? 8 : 4;

// Output rows [t * 16 + h * L, + L) for rows [q0, q0 + r) of x.
template <int kBits, int r>
void pass(const A8Packed& w, const A8Act& a, int64_t t, int64_t h, int64_t q0) {
  constexpr int64_t S = kBits == 8 ? 8 : 4;
  const int64_t k = w.k, gpr = k / w.gs, bpg = w.gs / 32;
  const uint8_t* wc = w.codes.data() + t * (k / 32) * S * 64 + h * 4 * L;
  const float* ws = w.scales.data() + t * gpr * kTile + h * L;
  const int32_t* wcorr = kBits == 8 && kOffset8 ? w.corr.data() + t * gpr * kTile + h * L : nullptr;
  const int8_t* x = a.xq + q0 * k;
  VF acc[r];
  for (int q = 0; q < r; ++q) acc[q] = fzero();
  for (int64_t g = 0; g < gpr; ++g) {
    VI ia[r];
    for (int q = 0; q < r; ++q) {
      if constexpr (kBits == 4) {
        ia[q] = seti(a.xs[(q0 + q) * gpr + g]);
      } else {
        ia[q] = kOffset8 ? loadi(wcorr + g * kTile) : izero();
      }
    }
    for (int64_t b = g * bpg; b < (g + 1) * bpg; ++b) {
      const uint8_t* wb = wc + b * S * 64;
      const int8_t* xb = x + b * 32;
      for (int64_t s = 0; s < S; ++s) {
        const VI raw = loadi(wb + s * 64);
        if constexpr (kBits == 8) {
          const VI wp = prep8(raw);
          for (int q = 0; q < r; ++q) ia[q] = dot8(ia[q], raw, wp, bcast4(xb + q * k + 4 * s));
        } else {
          const VI lo = lo4(raw), hi = hi4(raw);
          for (int q = 0; q < r; ++q)
            ia[q] = dot4(ia[q], lo, hi, bcast4(xb + q * k + 4 * s), bcast4(xb + q * k + 16 + 4 * s));
        }
      }
    }
    const VF sw = loadf(ws + g * kTile);
    for (int q = 0; q < r; ++q)
      acc[q] = fma(cvt(ia[q]), mul(sw, setf(a.sa[(q0 + q) * gpr + g])), acc[q]);
  }
  const int64_t j = t * kTile + h * L;
  const int rows = static_cast<int>(std::min<int64_t>(L, w.n - j));
  for (int q = 0; q < r; ++q) store(a.y + (q0 + q) * a.ldy + j, acc[q], rows);
}

template <int kBits, int r>
void last_pass(const A8Packed& w, const A8Act& a, int64_t t, int64_t h, int64_t q0) {
  if constexpr (r > 0) {
    if (a.m - q0 == r) return pass<kBits, r>(w, a, t, h, q0);
    last_pass<kBits, r - 1>(w, a, t, h, q0);
  }
}

template <int kBits>
void packed_bits(const A8Packed& w, const A8Act& a, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t h = 0; h < kTile / L && t * kTile + h * L < w.n; ++h) {
      int64_t q0 = 0;
      for (; q0 + kR <= a.m; q0 += kR) pass<kBits, kR>(w, a, t, h, q0);
      last_pass<kBits, kR - 1>(w, a, t, h, q0);
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

// The activations in the form this variant's packed kernel reads (A8Act).
void qa8_prep(const float* x, int64_t m, int64_t k, int64_t gs, int bits, int8_t* xq, float* sa,
              int32_t* xs) {
  const int64_t gpr = k / gs;
  for (int64_t q = 0; q < m; ++q) {
    int8_t* c = xq + q * k;
    qa8_quantize(x + q * k, k, gs, c, sa + q * gpr);
    if (bits == 4) {
      for (int64_t g = 0; g < gpr; ++g) {
        int32_t sum = 0;
        for (int64_t e = 0; e < gs; ++e) sum += c[g * gs + e];
        xs[q * gpr + g] = -8 * sum;
      }
    } else if (kOffset8) {
      for (int64_t e = 0; e < k; ++e) c[e] = static_cast<int8_t>(static_cast<uint8_t>(c[e]) ^ 0x80);
    }
  }
}

void qa8_packed(const A8Packed& w, const A8Act& a, int64_t t0, int64_t t1) {
  if (w.bits == 8) {
    packed_bits<8>(w, a, t0, t1);
  } else {
    packed_bits<4>(w, a, t0, t1);
  }
}

#if defined(DS_QA8_SCALAR)
// Groups of a size the packed layout does not take, on the stored layout (activation codes as
// qa8_prep writes them here: signed, in order).
void qa8_rows(const A8Rows& w, const A8Act& a, int64_t j0, int64_t j1) {
  const int64_t gpr = w.k / w.gs;
  for (int64_t j = j0; j < j1; ++j)
    for (int64_t q = 0; q < a.m; ++q) {
      float acc = 0.0f;
      for (int64_t g = 0; g < gpr; ++g) {
        int32_t dot = 0;
        for (int64_t e = g * w.gs; e < (g + 1) * w.gs; ++e) {
          const uint8_t* row = w.data + j * w.kcode;
          const int c = w.bits == 8 ? static_cast<int8_t>(row[e])
                                    : (e % 2 ? row[e / 2] >> 4 : row[e / 2] & 0xF) - 8;
          dot += c * a.xq[q * w.k + e];
        }
        acc += static_cast<float>(dot) * (w.scales[j * gpr + g] * a.sa[q * gpr + g]);
      }
      a.y[q * a.ldy + j] = acc;
    }
}
#endif

}  // namespace DS_QA8_NS
}  // namespace ds::quant
