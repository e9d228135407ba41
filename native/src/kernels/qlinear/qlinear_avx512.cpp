// The quantized linear layer's kernel for the avx512 variant (flags from CMake by file name).
#define DS_QLIN_NS avx512
#define DS_QLIN_AVX512 1
#include "qlinear_impl.h"
