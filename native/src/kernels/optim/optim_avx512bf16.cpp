// AVX-512 + AVX512_BF16 variant of the optimizer kernels: the AVX-512 kernels with bf16 stores
// rounded by vcvtne2ps2bf16 (one instruction for 32 lanes instead of thirteen).
// Compiled with -mavx512bf16 only for this file; chosen at run time when the CPU reports
// AVX512_BF16 (AMD Zen 4 and later, Intel Cooper Lake and Sapphire Rapids and later).
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "variants.h"

namespace ds {
namespace optim {
namespace avx512bf16 {

#include "vec_avx512.h"
#include "kernels_impl.h"

}  // namespace avx512bf16
}  // namespace optim
}  // namespace ds
