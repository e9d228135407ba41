// AVX-512 (F/BW/VL/DQ) variant of the optimizer kernels (two 16-lane fp32 registers per step).
// Compiled with those flags only for this file; chosen at run time when the CPU and OS support
// them and the CPU lacks AVX512_BF16 (see optim_avx512bf16.cpp).
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "variants.h"

namespace ds {
namespace optim {
namespace avx512 {

#include "vec_avx512.h"
#include "kernels_impl.h"

}  // namespace avx512
}  // namespace optim
}  // namespace ds
