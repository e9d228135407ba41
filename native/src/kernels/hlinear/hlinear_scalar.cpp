// The fp16-weight linear's kernel for the scalar variant (flags from CMake by file name).
#define DS_HLIN_NS scalar
#include "hlinear_impl.h"
