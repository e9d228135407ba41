// The int8-activation quantized linear kernel for the avxvnni variant (flags from CMake by file
// name).
#define DS_QA8_NS avxvnni
#define DS_QA8_AVXVNNI 1
#include "qlinear_a8_impl.h"
