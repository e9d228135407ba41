// Group-wise integer and fp8 quantization kernels. Arithmetic mirrors ds.ops.quant.reference
// operation for operation (float32, no fused multiply-add) so results are bit-identical.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "ds/quant.h"
#include "fp8_impl.h"
#include "load.h"
#include "parallel.h"

namespace ds::quant {

namespace {

// Round half to even for |v| < 2^22 with plain SSE2 adds (vectorisable, unlike nearbyint).
inline float rne(float v) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23; exact without -ffast-math
  return (v + kMagic) - kMagic;
}

// Subnormal scales are raised to the smallest normal float so that 1 / scale stays finite.
inline float normal_scale(float s) { return (s > 0.0f && s < FLT_MIN) ? FLT_MIN : s; }

inline float clampf(float v, float lo, float hi) { return std::min(std::max(v, lo), hi); }

struct GroupParams {
  float scale;
  float inv;
  float zp;
};

template <class L>
GroupParams int_params(const typename L::T* xs, int64_t len, const IntScheme& s) {
  GroupParams p{};
  if (s.asym) {
    float hi = 0.0f, lo = 0.0f;
    for (int64_t i = 0; i < len; ++i) {
      const float v = L::load(xs[i]);
      hi = std::max(hi, v);
      lo = std::min(lo, v);
    }
    p.scale = normal_scale((hi - lo) / static_cast<float>(s.qmax - s.qmin));
    p.inv = p.scale > 0.0f ? 1.0f / p.scale : 0.0f;
    p.zp = clampf(rne(-lo * p.inv), 0.0f, static_cast<float>(s.qmax));
  } else {
    float amax = 0.0f;
    for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(L::load(xs[i])));
    p.scale = normal_scale(amax / static_cast<float>(s.qmax));
    p.inv = p.scale > 0.0f ? 1.0f / p.scale : 0.0f;
    p.zp = 0.0f;
  }
  return p;
}

template <class L>
void quantize_int_groups(const typename L::T* x, int64_t n, int64_t gs, const IntScheme& s,
                         uint8_t* data, float* scales, float* zps, int64_t g0, int64_t g1) {
  const float qmin = static_cast<float>(s.qmin), qmax = static_cast<float>(s.qmax);
  const int64_t bpg = s.bits == 4 ? (gs + 1) / 2 : gs;
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t start = g * gs;
    const int64_t len = std::min(gs, n - start);
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
      for (int64_t j = 0; j < bpg; ++j) {
        const int64_t i0 = 2 * j, i1 = 2 * j + 1;
        const int lo = i0 < len ? code(L::load(xs[i0])) : pad;
        const int hi = i1 < len ? code(L::load(xs[i1])) : (i1 < gs ? pad : 0);
        out[j] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  }
}

template <class L>
void quantize_fp8_groups(const typename L::T* x, int64_t n, int64_t gs, Fp8Format f,
                         uint8_t* data, float* scales, int64_t g0, int64_t g1) {
  const float fmax = f == Fp8Format::E4M3 ? 448.0f : 57344.0f;
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t start = g * gs;
    const int64_t len = std::min(gs, n - start);
    const typename L::T* xs = x + start;
    float amax = 0.0f;
    for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(L::load(xs[i])));
    const float scale = normal_scale(amax / fmax);
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

int64_t groups_of(int64_t n, int64_t gs) { return (n + gs - 1) / gs; }

}  // namespace

void quantize_int(const void* x, InputType in, int64_t n, int64_t gs, IntScheme s,
                  uint8_t* data, float* scales, float* zps) {
  for_group_ranges(groups_of(n, gs), gs, [&](int64_t g0, int64_t g1) {
    switch (in) {
      case InputType::F32:
        quantize_int_groups<LoadF32>(static_cast<const float*>(x), n, gs, s, data, scales, zps,
                                     g0, g1);
        break;
      case InputType::BF16:
        quantize_int_groups<LoadBF16>(static_cast<const uint16_t*>(x), n, gs, s, data, scales,
                                      zps, g0, g1);
        break;
      case InputType::F16:
        quantize_int_groups<LoadF16>(static_cast<const uint16_t*>(x), n, gs, s, data, scales,
                                     zps, g0, g1);
        break;
    }
  });
}

void quantize_fp8(const void* x, InputType in, int64_t n, int64_t gs, Fp8Format f,
                  uint8_t* data, float* scales) {
  for_group_ranges(groups_of(n, gs), gs, [&](int64_t g0, int64_t g1) {
    switch (in) {
      case InputType::F32:
        quantize_fp8_groups<LoadF32>(static_cast<const float*>(x), n, gs, f, data, scales, g0,
                                     g1);
        break;
      case InputType::BF16:
        quantize_fp8_groups<LoadBF16>(static_cast<const uint16_t*>(x), n, gs, f, data, scales,
                                      g0, g1);
        break;
      case InputType::F16:
        quantize_fp8_groups<LoadF16>(static_cast<const uint16_t*>(x), n, gs, f, data, scales,
                                     g0, g1);
        break;
    }
  });
}

void dequantize_int(const uint8_t* data, const float* scales, const float* zps, int64_t n,
                    int64_t gs, IntScheme s, float* out) {
  const int64_t bpg = s.bits == 4 ? (gs + 1) / 2 : gs;
  for_group_ranges(groups_of(n, gs), gs, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t start = g * gs;
      const int64_t len = std::min(gs, n - start);
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
        for (int64_t i = 0; i < len; ++i) {
          const int c = (in[i >> 1] >> ((i & 1) * 4)) & 0xF;
          o[i] = (static_cast<float>(c) - zp) * scale;
        }
      }
    }
  });
}

void dequantize_fp8(const uint8_t* data, const float* scales, int64_t n, int64_t gs,
                    Fp8Format f, float* out) {
  const float* table = fp8_table(f);
  for_group_ranges(groups_of(n, gs), gs, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t start = g * gs;
      const int64_t len = std::min(gs, n - start);
      const float scale = scales[g];
      const uint8_t* in = data + start;
      float* o = out + start;
      for (int64_t i = 0; i < len; ++i) o[i] = table[in[i]] * scale;
    }
  });
}

}  // namespace ds::quant
