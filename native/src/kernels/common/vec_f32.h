// fp32 vector operations of one ISA variant, for the kernels written once over a vector type V of
// W lanes (qlinear_impl.h, hlinear_impl.h): AVX-512 where the including file defines
// DS_VEC_AVX512, AVX2 + FMA for DS_VEC_AVX2, else one float per "vector". The definitions have
// internal linkage, so each variant's file (compiled with its own ISA flags) has its own.
#pragma once

#if defined(DS_VEC_AVX2) || defined(DS_VEC_AVX512)
#include <immintrin.h>
#endif

namespace ds::vec {
namespace {

#if defined(DS_VEC_AVX512) || defined(DS_VEC_AVX2)
#if defined(DS_VEC_AVX512)
constexpr int W = 16;
using V = __m512;
#define DS_VEC_OP(op) _mm512_##op
inline float hsum(V v) { return _mm512_reduce_add_ps(v); }
#else
constexpr int W = 8;
using V = __m256;
#define DS_VEC_OP(op) _mm256_##op
inline float hsum(V v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif
inline V zero() { return DS_VEC_OP(setzero_ps)(); }
inline V loadx(const float* p) { return DS_VEC_OP(loadu_ps)(p); }
inline V fma(V a, V b, V c) { return DS_VEC_OP(fmadd_ps)(a, b, c); }
inline V bcast(float s) { return DS_VEC_OP(set1_ps)(s); }
#undef DS_VEC_OP
#else
constexpr int W = 1;
using V = float;
inline V zero() { return 0.0f; }
inline V loadx(const float* p) { return *p; }
inline V fma(V a, V b, V c) { return a * b + c; }
inline V bcast(float s) { return s; }
inline float hsum(V v) { return v; }
#endif

}  // namespace
}  // namespace ds::vec
