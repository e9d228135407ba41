// The int8-activation quantized linear kernel for the avx512vnni variant (flags from CMake by file
// name).
#define DS_QA8_NS avx512vnni
#define DS_QA8_AVX512VNNI 1
#include "qlinear_a8_impl.h"
