// The paged decode attention kernel for the avx2 variant (flags from CMake by file name).
#define DS_PDA_NS avx2
#include "paged_decode_impl.h"
