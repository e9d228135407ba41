// The quantization kernels, written once and compiled per ISA by quant_<isa>.cpp (each defines
// DS_QUANT_NS first). Arithmetic mirrors ds.ops.quant.reference operation for operation (float32,
// no fused multiply-add) so that every variant produces the reference's bytes.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "ds/quant.h"
#include "fp8_impl.h"
#include "load.h"
#include "variants.h"

#ifndef DS_QUANT_NS
#error "define DS_QUANT_NS (the variant namespace) before including quant_impl.h"
#endif

namespace ds::quant::DS_QUANT_NS {

namespace {

// Local min/max (not std::min/std::max): inline templates shared with other translation units
// could be emitted once, compiled for another ISA.
inline float fmaxf_(float a, float b) { return a < b ? b : a; }
inline float fminf_(float a, float b) { return b < a ? b : a; }
inline int64_t imin_(int64_t a, int64_t b) { return b < a ? b : a; }

// Round half to even. With SSE4.1 and up, rint is one vector instruction (roundps); it also keeps
// x * inv a separate product: an FMA-enabled build would otherwise fuse x * inv + magic and round
// differently from the reference. The baseline build (no SSE4.1, no FMA) adds 1.5 * 2^23, which
// rounds |v| < 2^22 to even in plain SSE2.
inline float rne(float v) {
#if defined(__SSE4_1__) || defined(__aarch64__)
  return __builtin_rintf(v);
#else
  constexpr float kMagic = 12582912.0f;
  return (v + kMagic) - kMagic;
#endif
}

// A group with a nonzero spread gets a scale of at least the smallest normal float: a subnormal
// scale would make 1 / scale overflow, and spread / qmax can underflow to 0 for a group of tiny
// subnormals, which would encode them all as 0 (and decode with an error above half a step).
inline float normal_scale(float s, float spread) {
  return (spread > 0.0f && s < FLT_MIN) ? FLT_MIN : s;
}

inline float clampf(float v, float lo, float hi) { return fminf_(fmaxf_(v, lo), hi); }

// Reductions over kLanes independent accumulators: vectorisable without reassociating anything
// inexact (max and min give the same result in any order).
constexpr int kLanes = 16;

template <class L>
float abs_max(const typename L::T* xs, int64_t len) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= len; i += kLanes)
    for (int k = 0; k < kLanes; ++k) acc[k] = fmaxf_(acc[k], __builtin_fabsf(L::load(xs[i + k])));
  float m = 0.0f;
  for (; i < len; ++i) m = fmaxf_(m, __builtin_fabsf(L::load(xs[i])));
  for (int k = 0; k < kLanes; ++k) m = fmaxf_(m, acc[k]);
  return m;
}

template <class L>
void range_min_max(const typename L::T* xs, int64_t len, float* lo_out, float* hi_out) {
  float lo[kLanes] = {}, hi[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= len; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const float v = L::load(xs[i + k]);
      lo[k] = fminf_(lo[k], v);
      hi[k] = fmaxf_(hi[k], v);
    }
  }
  float l = 0.0f, h = 0.0f;
  for (; i < len; ++i) {
    const float v = L::load(xs[i]);
    l = fminf_(l, v);
    h = fmaxf_(h, v);
  }
  for (int k = 0; k < kLanes; ++k) {
    l = fminf_(l, lo[k]);
    h = fmaxf_(h, hi[k]);
  }
  *lo_out = l;
  *hi_out = h;
}

struct GroupParams {
  float scale;
  float inv;
  float zp;
};

inline GroupParams asym_params(float lo, float hi, const IntScheme& s) {
  GroupParams p{};
  const float range = static_cast<float>(s.qmax - s.qmin);
  const float spread = hi - lo;
  // Finite values of opposite sign near the float32 maximum overflow hi - lo; divide first
  // there (only there, so every other group keeps the one-division rounding).
  const bool overflow = std::isinf(spread) && std::isfinite(hi) && std::isfinite(lo);
  p.scale = normal_scale(overflow ? hi / range - lo / range : spread / range, spread);
  p.inv = p.scale > 0.0f ? 1.0f / p.scale : 0.0f;
  p.zp = clampf(rne(-lo * p.inv), 0.0f, static_cast<float>(s.qmax));
  return p;
}

inline GroupParams sym_params(float amax, const IntScheme& s) {
  GroupParams p{};
  p.scale = normal_scale(amax / static_cast<float>(s.qmax), amax);
  p.inv = p.scale > 0.0f ? 1.0f / p.scale : 0.0f;
  p.zp = 0.0f;
  return p;
}

template <class L>
GroupParams int_params(const typename L::T* xs, int64_t len, const IntScheme& s) {
  if (s.asym) {
    float hi = 0.0f, lo = 0.0f;
    range_min_max<L>(xs, len, &lo, &hi);
    return asym_params(lo, hi, s);
  }
  return sym_params(abs_max<L>(xs, len), s);
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define DS_QUANT_GROUP_AVX512 1
#include "quant_group_avx512.h"
#endif

template <class L>
void quantize_int_t(const typename L::T* x, int64_t n, int64_t gs, const IntScheme& s,
                         uint8_t* data, float* scales, float* zps, int64_t g0, int64_t g1) {
  const float qmin = static_cast<float>(s.qmin), qmax = static_cast<float>(s.qmax);
  const int64_t bpg = s.bits == 4 ? (gs + 1) / 2 : gs;
  int64_t g = g0;
#if defined(DS_QUANT_GROUP_AVX512)
  // Whole groups of a multiple of 32 elements, in blocks; the rest take the portable loop.
  if (gs % 32 == 0) {
    const int64_t whole = imin_(g1, n / gs);
    for (int64_t k = 0; g < whole; g += k) {
      k = imin_(kBlock, whole - g);
      quantize_int_block_avx512<L>(x + g * gs, gs, k, s, data + g * bpg, bpg, scales + g,
                                   s.asym ? zps + g : nullptr);
    }
  }
#endif
  for (; g < g1; ++g) {
    const int64_t start = g * gs;
    const int64_t len = imin_(gs, n - start);
    const typename L::T* xs = x + start;
    const GroupParams p = int_params<L>(xs, len, s);
    scales[g] = p.scale;
    if (s.asym) zps[g] = p.zp;
    uint8_t* out = data + g * bpg;
    const float inv = p.inv, zp = p.zp;
    // Codes as stored: int8 two's complement, int4 sym biased by 8, asym as is.
    const int bias = (s.bits == 4 && !s.asym) ? 8 : 0;
    auto code = [&](float v) {
      return static_cast<int>(clampf(rne(v * inv) + zp, qmin, qmax)) + bias;
    };
    const int pad = static_cast<int>(zp) + bias;
    if (s.bits == 8) {
      for (int64_t i = 0; i < len; ++i) out[i] = static_cast<uint8_t>(code(L::load(xs[i])));
      for (int64_t i = len; i < gs; ++i) out[i] = static_cast<uint8_t>(pad);
    } else {
      // Codes of a chunk first (a vectorisable loop), then packed in pairs; positions past the
      // data hold the padding code, and the spare nibble of an odd group size holds 0.
      constexpr int64_t kChunk = 256;
      uint8_t tmp[kChunk];
      const int64_t padded = 2 * bpg;
      for (int64_t c0 = 0; c0 < padded; c0 += kChunk) {
        const int64_t c1 = imin_(c0 + kChunk, padded);
        const int64_t real_end = imin_(c1, len);
        for (int64_t i = c0; i < real_end; ++i)
          tmp[i - c0] = static_cast<uint8_t>(code(L::load(xs[i])));
        for (int64_t i = real_end > c0 ? real_end : c0; i < c1; ++i)
          tmp[i - c0] = static_cast<uint8_t>(i < gs ? pad : 0);
        for (int64_t j = 0; j < (c1 - c0) / 2; ++j)
          out[c0 / 2 + j] = static_cast<uint8_t>(tmp[2 * j] | (tmp[2 * j + 1] << 4));
      }
    }
  }
}

template <class L>
void quantize_fp8_t(const typename L::T* x, int64_t n, int64_t gs, Fp8Format f,
                         uint8_t* data, float* scales, int64_t g0, int64_t g1) {
  const float fmax = f == Fp8Format::E4M3 ? 448.0f : 57344.0f;
  int64_t g = g0;
#if defined(DS_QUANT_GROUP_AVX512)
  if (gs % 32 == 0) {
    const int64_t whole = imin_(g1, n / gs);
    for (int64_t k = 0; g < whole; g += k) {
      k = imin_(kBlock, whole - g);
      quantize_fp8_block_avx512<L>(x + g * gs, gs, k, f, data + g * gs, scales + g);
    }
  }
#endif
  for (; g < g1; ++g) {
    const int64_t start = g * gs;
    const int64_t len = imin_(gs, n - start);
    const typename L::T* xs = x + start;
    const float amax = abs_max<L>(xs, len);
    const float scale = normal_scale(amax / fmax, amax);
    const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    scales[g] = scale;
    uint8_t* out = data + g * gs;
    if (f == Fp8Format::E4M3) {
      for (int64_t i = 0; i < len; ++i)
        out[i] = encode_fp8<3, 7>(clampf(L::load(xs[i]) * inv, -fmax, fmax));
    } else {
      for (int64_t i = 0; i < len; ++i)
        out[i] = encode_fp8<2, 15>(clampf(L::load(xs[i]) * inv, -fmax, fmax));
    }
    for (int64_t i = len; i < gs; ++i) out[i] = 0;
  }
}

}  // namespace

void quantize_int_groups(const void* x, InputType in, int64_t n, int64_t gs, const IntScheme& s,
                         uint8_t* data, float* scales, float* zps, int64_t g0, int64_t g1) {
  switch (in) {
    case InputType::F32:
      return quantize_int_t<LoadF32>(static_cast<const float*>(x), n, gs, s, data, scales, zps,
                                     g0, g1);
    case InputType::BF16:
      return quantize_int_t<LoadBF16>(static_cast<const uint16_t*>(x), n, gs, s, data, scales,
                                      zps, g0, g1);
    case InputType::F16:
      return quantize_int_t<LoadF16>(static_cast<const uint16_t*>(x), n, gs, s, data, scales,
                                     zps, g0, g1);
  }
}

void quantize_fp8_groups(const void* x, InputType in, int64_t n, int64_t gs, Fp8Format f,
                         uint8_t* data, float* scales, int64_t g0, int64_t g1) {
  switch (in) {
    case InputType::F32:
      return quantize_fp8_t<LoadF32>(static_cast<const float*>(x), n, gs, f, data, scales, g0,
                                     g1);
    case InputType::BF16:
      return quantize_fp8_t<LoadBF16>(static_cast<const uint16_t*>(x), n, gs, f, data, scales,
                                      g0, g1);
    case InputType::F16:
      return quantize_fp8_t<LoadF16>(static_cast<const uint16_t*>(x), n, gs, f, data, scales,
                                     g0, g1);
  }
}

void dequantize_int_groups(const uint8_t* data, const float* scales, const float* zps, int64_t n,
                           int64_t gs, const IntScheme& s, float* out, int64_t g0, int64_t g1) {
  const int64_t bpg = s.bits == 4 ? (gs + 1) / 2 : gs;
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t start = g * gs;
    const int64_t len = imin_(gs, n - start);
    const float scale = scales[g];
    const float zp = s.asym ? zps[g] : (s.bits == 4 ? 8.0f : 0.0f);
    const uint8_t* in = data + g * bpg;
    float* o = out + start;
    if (s.bits == 8 && !s.asym) {
      const int8_t* q = reinterpret_cast<const int8_t*>(in);
      for (int64_t i = 0; i < len; ++i) o[i] = static_cast<float>(q[i]) * scale;
    } else if (s.bits == 8) {
      for (int64_t i = 0; i < len; ++i) o[i] = (static_cast<float>(in[i]) - zp) * scale;
    } else {
      const int64_t pairs = len / 2;
      for (int64_t j = 0; j < pairs; ++j) {
        const uint8_t b = in[j];
        o[2 * j] = (static_cast<float>(b & 0xF) - zp) * scale;
        o[2 * j + 1] = (static_cast<float>(b >> 4) - zp) * scale;
      }
      if (len % 2) o[len - 1] = (static_cast<float>(in[pairs] & 0xF) - zp) * scale;
    }
  }
}

void dequantize_fp8_groups(const uint8_t* data, const float* scales, int64_t n, int64_t gs,
                           Fp8Format f, float* out, int64_t g0, int64_t g1) {
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t start = g * gs;
    const int64_t len = imin_(gs, n - start);
    const float scale = scales[g];
    const uint8_t* in = data + start;
    float* o = out + start;
#if defined(DS_QUANT_GROUP_AVX512)
    if (len == gs && gs % 16 == 0) {
      dequantize_fp8_group_avx512(in, len, scale, f == Fp8Format::E4M3, o);
      continue;
    }
#endif
#if defined(__AVX2__) || defined(__aarch64__)
    // Wide vectors: decoding by arithmetic beats a gather from the table.
    if (f == Fp8Format::E4M3) {
      for (int64_t i = 0; i < len; ++i) o[i] = decode_fp8<3, 7, true>(in[i]) * scale;
    } else {
      for (int64_t i = 0; i < len; ++i) o[i] = decode_fp8<2, 15, false>(in[i]) * scale;
    }
#else
    const float* table = fp8_table(f);
    for (int64_t i = 0; i < len; ++i) o[i] = table[in[i]] * scale;
#endif
  }
}

}  // namespace ds::quant::DS_QUANT_NS
