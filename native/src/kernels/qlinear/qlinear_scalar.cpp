// The quantized linear layer's kernel for the scalar variant (flags from CMake by file name).
#define DS_QLIN_NS scalar
#include "qlinear_impl.h"
