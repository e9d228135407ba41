// AVX-512 group kernels for the quantizers (int8/int4 symmetric and asymmetric, fp8): one pass
// over the group for its statistics (max |x|, or min and max) in 16-lane registers, then one
// fused pass that scales, rounds, offsets, clamps, narrows and packs 16 (int8, fp8) or 32 (int4)
// codes per step. Included by quant_impl.h when the variant is compiled with AVX-512 F/BW.
//
// Every operation mirrors the portable loop in quant_impl.h, so the bytes are the same:
//   - max/min: vmaxps(v, acc) returns acc when v is NaN or equal, like fmaxf_(acc, v); the
//     accumulators start at 0 like the portable ones. Max and min are exact in any order.
//   - code: v * inv (its own rounding; the library is built with -ffp-contract=off), round half
//     to even (vrndscaleps, as rintf), + zp, clamp with the operands ordered so a NaN passes
//     through like clampf, truncate to int32 (NaN gives 0x80000000 like the scalar conversion),
//     + bias, keep the low byte.
// Only whole groups whose size is a multiple of 32 take this path; other groups (and the last
// partial group) take the portable loop.

template <class L>
inline __m512 load16(const typename L::T* p);
template <>
inline __m512 load16<LoadF32>(const float* p) {
  return _mm512_loadu_ps(p);
}
template <>
inline __m512 load16<LoadBF16>(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
template <>
inline __m512 load16<LoadF16>(const uint16_t* p) {
  // vcvtph2ps is exact for every half, subnormals included (no DAZ for this conversion).
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Lane reductions as a tree: exact for max/min in any order, since the accumulators never hold
// NaN or -0 (they start at +0 and take a value only when it is strictly larger / smaller).
inline float hmax16(__m512 v) {
  __m256 h = _mm256_max_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 q = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_max_ps(q, _mm_movehl_ps(q, q));
  q = _mm_max_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}
inline float hmin16(__m512 v) {
  __m256 h = _mm256_min_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 q = _mm_min_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_min_ps(q, _mm_movehl_ps(q, q));
  q = _mm_min_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}

template <class L>
float abs_max_avx512(const typename L::T* xs, int64_t len) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  __m512 m0 = _mm512_setzero_ps(), m1 = _mm512_setzero_ps();
  for (int64_t i = 0; i < len; i += 32) {
    m0 = _mm512_max_ps(_mm512_andnot_ps(sign, load16<L>(xs + i)), m0);
    m1 = _mm512_max_ps(_mm512_andnot_ps(sign, load16<L>(xs + i + 16)), m1);
  }
  return hmax16(_mm512_max_ps(m0, m1));
}

template <class L>
GroupParams int_params_avx512(const typename L::T* xs, int64_t len, const IntScheme& s) {
  const __m512 zero = _mm512_setzero_ps();
  if (s.asym) {
    __m512 lo0 = zero, lo1 = zero, hi0 = zero, hi1 = zero;
    for (int64_t i = 0; i < len; i += 32) {
      const __m512 a = load16<L>(xs + i), b = load16<L>(xs + i + 16);
      lo0 = _mm512_min_ps(a, lo0);
      hi0 = _mm512_max_ps(a, hi0);
      lo1 = _mm512_min_ps(b, lo1);
      hi1 = _mm512_max_ps(b, hi1);
    }
    return asym_params(hmin16(_mm512_min_ps(lo0, lo1)), hmax16(_mm512_max_ps(hi0, hi1)), s);
  }
  return sym_params(abs_max_avx512<L>(xs, len), s);
}

// How a group's codes are formed (all give the portable loop's bytes):
//   kSym: round to nearest even while converting (one vcvtps2dq instead of vrndscaleps +
//     vcvttps2dq), without the clamp, which can change no code: every x of the group has
//     |x| <= amax and scale >= amax / qmax up to one rounding, so |y| <= qmax (1 + 3 * 2^-24),
//     which rounds to qmax at most (a raised or infinite scale only makes |y| smaller); a NaN
//     converts to 0x80000000 as the clamp, which passes NaN, and the truncation gave.
//   kAsymInt: rne(y) + zp, clamped, in integers: a finite y is within the code range up to
//     rounding (every x lies in [lo, hi], so |x| <= spread and |x * inv| <= range), the sums
//     are small integers either way, and a NaN y converts to 0x80000000, which + zp (>= 0)
//     clamps to qmin = 0: the low byte the float path stores for NaN. Needs qmin = 0 (every
//     asymmetric scheme has it).
//   kAsymFloat: rne(y) + zp, clamped, in floats, for any other asymmetric group: one whose zero
//     point is NaN (a -inf in the group) must turn every code into NaN's byte.
enum CodeMode { kSym, kAsymInt, kAsymFloat };

// 16 codes as int32 lanes. BIAS: add the int4 symmetric bias (8); the others add nothing.
template <class L, CodeMode MODE, bool BIAS>
inline __m512i codes16(const typename L::T* p, __m512 inv, __m512 zp, __m512i zpi, __m512 qmin,
                       __m512 qmax, __m512i qmaxi, __m512i bias) {
  constexpr int kRne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m512 y = _mm512_mul_ps(load16<L>(p), inv);
  __m512i q;
  if constexpr (MODE == kSym) {
    q = _mm512_cvt_roundps_epi32(y, kRne);
  } else if constexpr (MODE == kAsymInt) {
    q = _mm512_add_epi32(_mm512_cvt_roundps_epi32(y, kRne), zpi);
    q = _mm512_min_epi32(qmaxi, _mm512_max_epi32(_mm512_setzero_si512(), q));  // qmin = 0
  } else {
    const __m512 r = _mm512_add_ps(_mm512_roundscale_ps(y, kRne), zp);
    q = _mm512_cvttps_epi32(_mm512_min_ps(qmax, _mm512_max_ps(qmin, r)));
  }
  if constexpr (BIAS) q = _mm512_add_epi32(q, bias);
  return q;
}

template <class L, CodeMode MODE>
void codes_avx512(const typename L::T* xs, int64_t len, const IntScheme& s, const GroupParams& p,
                  uint8_t* out) {
  const __m512 inv = _mm512_set1_ps(p.inv), zp = _mm512_set1_ps(p.zp);
  const __m512i zpi = _mm512_set1_epi32(MODE == kAsymInt ? static_cast<int>(p.zp) : 0);
  const __m512 qmin = _mm512_set1_ps(static_cast<float>(s.qmin));
  const __m512 qmax = _mm512_set1_ps(static_cast<float>(s.qmax));
  const __m512i qmaxi = _mm512_set1_epi32(s.qmax);
  if (s.bits == 8) {
    const __m512i none = _mm512_setzero_si512();
    for (int64_t i = 0; i < len; i += 16)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                       _mm512_cvtepi32_epi8(codes16<L, MODE, false>(xs + i, inv, zp, zpi, qmin,
                                                                    qmax, qmaxi, none)));
    return;
  }
  // int4: the code bytes (vpmovdb keeps each code's low byte, as the portable loop stores them)
  // are read as 16-bit words c0 | c1 << 8; one vpternlog keeps bits 0-3 of the word and bits
  // 4-7 of the word shifted right by 4 (c1's low nibble); vpmovwb keeps the low bytes.
  constexpr bool kBias = MODE == kSym;  // int4 symmetric codes are stored biased by 8
  const __m512i bias = _mm512_set1_epi32(8);
  const __m256i nib = _mm256_set1_epi16(0x000F);
  for (int64_t i = 0; i < len; i += 32) {
    const __m128i a = _mm512_cvtepi32_epi8(
        codes16<L, MODE, kBias>(xs + i, inv, zp, zpi, qmin, qmax, qmaxi, bias));
    const __m128i b = _mm512_cvtepi32_epi8(
        codes16<L, MODE, kBias>(xs + i + 16, inv, zp, zpi, qmin, qmax, qmaxi, bias));
    const __m256i w = _mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1);
    // imm 0xE4: C ? A : B per bit, with C = nib, A = w, B = w >> 4
    const __m256i packed = _mm256_ternarylogic_epi32(w, _mm256_srli_epi16(w, 4), nib, 0xE4);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i / 2), _mm256_cvtepi16_epi8(packed));
  }
}

// Groups are processed in blocks of kBlock: first every group's statistics and parameters, then
// every group's codes. A group's codes wait on a serial chain (load, max, horizontal max, two
// divisions) of some 50 cycles; done group by group, one thread spends that chain on every group,
// while the parameters of a block are independent chains that overlap. The block's input
// (16 groups of 128 float32 = 8 KiB) is still in L1 when its codes pass reads it again.
constexpr int64_t kBlock = 16;

template <class L>
void quantize_int_block_avx512(const typename L::T* xs, int64_t gs, int64_t groups,
                               const IntScheme& s, uint8_t* out, int64_t bytes_per_group,
                               float* scales, float* zps) {
  GroupParams p[kBlock];
  for (int64_t j = 0; j < groups; ++j) {
    p[j] = int_params_avx512<L>(xs + j * gs, gs, s);
    scales[j] = p[j].scale;
    if (s.asym) zps[j] = p[j].zp;
  }
  for (int64_t j = 0; j < groups; ++j) {
    const typename L::T* x = xs + j * gs;
    uint8_t* o = out + j * bytes_per_group;
    if (!s.asym) codes_avx512<L, kSym>(x, gs, s, p[j], o);
    else if (s.qmin == 0 && p[j].zp == p[j].zp) codes_avx512<L, kAsymInt>(x, gs, s, p[j], o);
    else codes_avx512<L, kAsymFloat>(x, gs, s, p[j], o);
  }
}

// fp8 (e4m3 / e5m2) group kernel: max |x| as above, then encode_fp8 (fp8_impl.h) on 16 lanes:
// the same integer rounding of the float32 bits for normals, the same float addition for
// subnormals, selected per lane. The clamp mirrors clampf's operand order (NaN passes through).
template <int M, int BIAS>
inline __m128i encode_fp8_16(__m512 y) {
  const __m512i b = _mm512_castps_si512(y);
  const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(b, 24), _mm512_set1_epi32(0x80));
  const __m512i a = _mm512_and_si512(b, _mm512_set1_epi32(0x7FFFFFFF));
  constexpr int kEmin = 1 - BIAS;
  constexpr uint32_t kMinNormal = static_cast<uint32_t>(127 + kEmin) << 23;
  constexpr uint32_t kMagic = static_cast<uint32_t>(127 + kEmin - M + 23) << 23;
  constexpr int kShift = 23 - M;
  const __m512i magic = _mm512_set1_epi32(static_cast<int>(kMagic));
  const __m512i sub = _mm512_sub_epi32(
      _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(magic))),
      magic);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(a, kShift), _mm512_set1_epi32(1));
  const __m512i round = _mm512_add_epi32(_mm512_set1_epi32((1 << (kShift - 1)) - 1), odd);
  const __m512i rebias =
      _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(127 - BIAS) << 23));
  const __m512i normal =
      _mm512_srli_epi32(_mm512_sub_epi32(_mm512_add_epi32(a, round), rebias), kShift);
  const __mmask16 is_sub =
      _mm512_cmplt_epu32_mask(a, _mm512_set1_epi32(static_cast<int>(kMinNormal)));
  const __m512i code = _mm512_mask_blend_epi32(is_sub, normal, sub);
  return _mm512_cvtepi32_epi8(_mm512_or_si512(sign, code));
}

// The portable loop clamps y = x * inv to +-fmax before encoding; here the clamp can change no
// code, so it is left out (two vector instructions of about seventeen per 16 codes). Every x of
// the group has |x| <= amax (a NaN x gives a NaN y either way, and the clamp passes NaN), and
// scale >= amax / fmax up to one rounding, so |y| <= fmax (1 + 3 * 2^-24): at most three float32
// ulps above fmax, which encode to fmax's code (the next code up is 8x further than half a step
// away for e4m3's 448 and e5m2's 57344). A raised scale (a group of tiny values) and a zero or
// infinite scale (inv = 0) only make |y| smaller or NaN.
template <class L, int M, int BIAS>
void fp8_codes_avx512(const typename L::T* xs, int64_t len, float inv, uint8_t* out) {
  const __m512 vinv = _mm512_set1_ps(inv);
  for (int64_t i = 0; i < len; i += 16) {
    const __m512 y = _mm512_mul_ps(load16<L>(xs + i), vinv);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), encode_fp8_16<M, BIAS>(y));
  }
}


// fp8 blocks, in the same two phases as quantize_int_block_avx512.
template <class L>
void quantize_fp8_block_avx512(const typename L::T* xs, int64_t gs, int64_t groups, Fp8Format f,
                               uint8_t* out, float* scales) {
  const float fmax = f == Fp8Format::E4M3 ? 448.0f : 57344.0f;
  float inv[kBlock];
  for (int64_t j = 0; j < groups; ++j) {
    const float amax = abs_max_avx512<L>(xs + j * gs, gs);
    const float scale = normal_scale(amax / fmax, amax);
    scales[j] = scale;
    inv[j] = scale > 0.0f ? 1.0f / scale : 0.0f;
  }
  for (int64_t j = 0; j < groups; ++j) {
    if (f == Fp8Format::E4M3) fp8_codes_avx512<L, 3, 7>(xs + j * gs, gs, inv[j], out + j * gs);
    else fp8_codes_avx512<L, 2, 15>(xs + j * gs, gs, inv[j], out + j * gs);
  }
}

// fp8 decode through the half-precision converter (F16C, exact for every half): an e5m2 code is
// the high byte of the half with the same value; an e4m3 code shifted into a half's exponent and
// mantissa fields is its value times 2^-8 (the half's exponent bias is 8 more, subnormals
// included), so the 2^8 goes into the scale. The product with the scale is then the same single
// rounding of the same real number as the portable loop's decode(c) * scale. NaN codes (e4m3fn
// S.1111.111; e5m2 exponent 31 with a nonzero mantissa) become sign | 0x7FC00000 as there.
template <bool E4M3>
inline __m512 decode_fp8_16(__m128i codes) {
  const __m256i u = _mm256_cvtepu8_epi16(codes);
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  const __m512i qnan = _mm512_set1_epi32(0x7FC00000);
  if constexpr (E4M3) {
    // bits 0-6 of the code to bits 7-13 and the sign (bit 7) to bit 15: the shifted sign lands
    // on bit 14, and adding that bit to itself carries it into bit 15.
    const __m256i v = _mm256_slli_epi16(u, 7);
    const __m256i h = _mm256_add_epi16(v, _mm256_and_si256(v, _mm256_set1_epi16(0x4000)));
    const __mmask16 nan = _mm256_cmpeq_epi16_mask(_mm256_and_si256(u, _mm256_set1_epi16(0x7F)),
                                                  _mm256_set1_epi16(0x7F));
    const __m512i f = _mm512_castps_si512(_mm512_cvtph_ps(h));
    // NaN lanes: (f & sign) | qnan (imm 0xEA: (A & B) | C)
    return _mm512_castsi512_ps(_mm512_mask_ternarylogic_epi32(f, nan, sign, qnan, 0xEA));
  } else {
    const __m512 f = _mm512_cvtph_ps(_mm256_slli_epi16(u, 8));
    const __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
    return _mm512_castsi512_ps(_mm512_mask_ternarylogic_epi32(_mm512_castps_si512(f), nan, sign,
                                                              qnan, 0xEA));
  }
}

// One whole group of a multiple of 16 codes.
inline void dequantize_fp8_group_avx512(const uint8_t* in, int64_t len, float scale, bool e4m3,
                                        float* out) {
  if (e4m3) {
    // scale * 2^8 is exact unless it overflows; then the 2^8 is applied on its own first.
    const float s256 = scale * 256.0f;
    if (__builtin_isinf(s256) && !__builtin_isinf(scale)) {
      const __m512 two8 = _mm512_set1_ps(256.0f), vs = _mm512_set1_ps(scale);
      for (int64_t i = 0; i < len; i += 16) {
        const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_mul_ps(decode_fp8_16<true>(c), two8), vs));
      }
      return;
    }
    const __m512 vs = _mm512_set1_ps(s256);
    for (int64_t i = 0; i < len; i += 16) {
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
      _mm512_storeu_ps(out + i, _mm512_mul_ps(decode_fp8_16<true>(c), vs));
    }
    return;
  }
  const __m512 vs = _mm512_set1_ps(scale);
  for (int64_t i = 0; i < len; i += 16) {
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(decode_fp8_16<false>(c), vs));
  }
}
