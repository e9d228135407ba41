// The int8-activation quantized linear kernel for the scalar variant (flags from CMake by file
// name).
#define DS_QA8_NS scalar
#define DS_QA8_SCALAR 1
#include "qlinear_a8_impl.h"
