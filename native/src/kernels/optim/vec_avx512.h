// AVX-512 vector type of the optimizer kernels: two 16-lane fp32 registers per step (32 lanes).
// Two independent registers per iteration give the out-of-order core twice the work to overlap,
// and 32 bf16 lanes are exactly one 512-bit load or store.
//
// Included inside namespace ds::optim::<isa> by optim_avx512.cpp (AVX-512 F/BW/VL/DQ) and by
// optim_avx512bf16.cpp (the same plus AVX512_BF16, which defines __AVX512BF16__): with
// AVX512_BF16 one vcvtne2ps2bf16 rounds 32 fp32 lanes to bf16 (nearest even, NaN kept quiet);
// without it the rounding is done with integer arithmetic. The includer has already included
// <immintrin.h> and <cstdint> at file scope.

struct V {
  struct reg {
    __m512 a, b;  // lanes 0-15 and 16-31
  };
  static constexpr int W = 32;

  static reg set1(float x) { return {_mm512_set1_ps(x), _mm512_set1_ps(x)}; }
  static reg load_f32(const float* p) { return {_mm512_loadu_ps(p), _mm512_loadu_ps(p + 16)}; }
  static reg load_bf16(const uint16_t* p) {
    // One load of 32 bf16 values; each permute places 16 of them in the high halves of 32-bit
    // lanes (the mask zeroes the low halves), which is their fp32 value.
    const __m512i h = _mm512_loadu_si512(p);
    const __m512i lo = _mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0, 8, 0, 7,
                                        0, 6, 0, 5, 0, 4, 0, 3, 0, 2, 0, 1, 0, 0, 0);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    const __mmask32 odd = 0xAAAAAAAAu;
    return {_mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(odd, lo, h)),
            _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(odd, hi, h))};
  }
  static reg load_f16(const uint16_t* p) {
    return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))),
            _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16)))};
  }
  static void store_f32(float* p, reg v) {
    _mm512_storeu_ps(p, v.a);
    _mm512_storeu_ps(p + 16, v.b);
  }

  // Round to nearest even with integer arithmetic on the 32-bit patterns (a NaN keeps its payload
  // with the quiet bit set instead of rounding into infinity), then one vpermt2w gathers the high
  // halves of both registers: 32 bf16 values, one store.
  static __m512i bf16_round(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    return _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x00400000));
  }
  static void store_bf16_int(uint16_t* p, reg v) {
    const __m512i high = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37,
                                          35, 33, 31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7,
                                          5, 3, 1);
    _mm512_storeu_si512(p, _mm512_permutex2var_epi16(bf16_round(v.a), high, bf16_round(v.b)));
  }
#if defined(__AVX512BF16__)
  static void store_bf16(uint16_t* p, reg v) {
    // vcvtne2ps2bf16 flushes fp32 subnormals to zero; torch rounds them like any other value.
    // bf16 has fp32's exponent range, so a converted lane is +-0 only if its input was +-0 or
    // subnormal: one vptestnmw over the 32 results finds both, and only a vector with a zero
    // lane pays for the exact test (vfpclassps) and, holding a subnormal, the integer path.
    const __m512i r = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(v.b, v.a));
    const __mmask32 zero = _mm512_testn_epi16_mask(r, _mm512_set1_epi16(0x7FFF));
    if (__builtin_expect(!_kortestz_mask32_u8(zero, zero), 0)) {
      const __mmask16 sub =
          _kor_mask16(_mm512_fpclass_ps_mask(v.a, 0x20), _mm512_fpclass_ps_mask(v.b, 0x20));
      if (!_kortestz_mask16_u8(sub, sub)) return store_bf16_int(p, v);
    }
    _mm512_storeu_si512(p, r);
  }
#else
  static void store_bf16(uint16_t* p, reg v) { store_bf16_int(p, v); }
#endif
  static void store_f16(uint16_t* p, reg v) {
    constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(v.a, kRound));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + 16), _mm512_cvtps_ph(v.b, kRound));
  }

  static reg add(reg x, reg y) { return {_mm512_add_ps(x.a, y.a), _mm512_add_ps(x.b, y.b)}; }
  static reg sub(reg x, reg y) { return {_mm512_sub_ps(x.a, y.a), _mm512_sub_ps(x.b, y.b)}; }
  static reg mul(reg x, reg y) { return {_mm512_mul_ps(x.a, y.a), _mm512_mul_ps(x.b, y.b)}; }
  static reg div(reg x, reg y) { return {_mm512_div_ps(x.a, y.a), _mm512_div_ps(x.b, y.b)}; }
  static reg sqrt(reg x) { return {_mm512_sqrt_ps(x.a), _mm512_sqrt_ps(x.b)}; }
  static reg fma(reg x, reg y, reg z) {
    return {_mm512_fmadd_ps(x.a, y.a, z.a), _mm512_fmadd_ps(x.b, y.b, z.b)};
  }
  // x * y - z
  static reg fmsub(reg x, reg y, reg z) {
    return {_mm512_fmsub_ps(x.a, y.a, z.a), _mm512_fmsub_ps(x.b, y.b, z.b)};
  }

  // sqrt(x), x >= 0, from the 14-bit reciprocal square root estimate and one Newton step
  // (about 2^-22 relative). The tiny addend keeps x = 0 finite (0 * rsqrt(tiny) = 0) and leaves
  // every x above 1e-30 unchanged; for subnormal x the absolute error stays under 1.1e-19.
  static __m512 fast_sqrt1(__m512 x) {
    const __m512 y = _mm512_rsqrt14_ps(_mm512_add_ps(x, _mm512_set1_ps(1.17549435e-38f)));
    const __m512 s = _mm512_mul_ps(x, y);
    const __m512 half = _mm512_set1_ps(0.5f);
    const __m512 r = _mm512_fnmadd_ps(s, _mm512_mul_ps(y, half), half);  // (1 - s*y) / 2
    return _mm512_fmadd_ps(s, r, s);
  }
  static reg fast_sqrt(reg x) { return {fast_sqrt1(x.a), fast_sqrt1(x.b)}; }
  // sqrt(x) from the estimate alone (under 2^-14 relative), for bf16 and fp16 params: the error
  // it leaves in the stored param stays below half an ulp (argument in adam_typed).
  static __m512 rough_sqrt1(__m512 x) {
    return _mm512_mul_ps(x, _mm512_rsqrt14_ps(_mm512_add_ps(x, _mm512_set1_ps(1.17549435e-38f))));
  }
  static reg rough_sqrt(reg x) { return {rough_sqrt1(x.a), rough_sqrt1(x.b)}; }
  // a / b from the 14-bit reciprocal estimate r and one Newton step on the quotient:
  // q = a*r + r*(a - b*a*r) (about 2^-22 relative).
  static __m512 fast_div1(__m512 a, __m512 b) {
    const __m512 r = _mm512_rcp14_ps(b);
    const __m512 q = _mm512_mul_ps(a, r);
    return _mm512_fmadd_ps(r, _mm512_fnmadd_ps(b, q, a), q);
  }
  static reg fast_div(reg a, reg b) { return {fast_div1(a.a, b.a), fast_div1(a.b, b.b)}; }
  // a / b from the estimate alone (under 2^-14 relative), for bf16 and fp16 params (bound in
  // adam_typed).
  static reg rough_div(reg a, reg b) {
    return {_mm512_mul_ps(a.a, _mm512_rcp14_ps(b.a)), _mm512_mul_ps(a.b, _mm512_rcp14_ps(b.b))};
  }

  static __m512 sign1(__m512 a) {
    const __m512 s = _mm512_or_ps(_mm512_and_ps(a, _mm512_set1_ps(-0.f)), _mm512_set1_ps(1.f));
    const __mmask16 nonzero = _mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_NEQ_OQ);
    return _mm512_mask_blend_ps(nonzero, a, s);  // 0 and NaN pass through
  }
  static reg sign(reg a) { return {sign1(a.a), sign1(a.b)}; }
};
