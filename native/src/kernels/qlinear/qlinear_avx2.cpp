// The quantized linear layer's kernel for the avx2 variant (flags from CMake by file name).
#define DS_QLIN_NS avx2
#define DS_QLIN_AVX2 1
#include "qlinear_impl.h"
