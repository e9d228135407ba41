// The fp16-weight linear's kernel for the avx2 variant (flags from CMake by file name).
#define DS_HLIN_NS avx2
#define DS_VEC_AVX2 1
#include "hlinear_impl.h"
