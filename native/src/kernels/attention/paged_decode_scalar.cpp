// The paged decode attention kernel for the scalar variant (flags from CMake by file name).
#define DS_PDA_NS scalar
#include "paged_decode_impl.h"
