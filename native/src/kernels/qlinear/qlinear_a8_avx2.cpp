// The int8-activation quantized linear kernel for the avx2 variant (flags from CMake by file
// name).
#define DS_QA8_NS avx2
#define DS_QA8_AVX2 1
#include "qlinear_a8_impl.h"
