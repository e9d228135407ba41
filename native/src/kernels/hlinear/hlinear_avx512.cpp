// The fp16-weight linear's kernel for the avx512 variant (flags from CMake by file name).
#define DS_HLIN_NS avx512
#define DS_VEC_AVX512 1
#include "hlinear_impl.h"
