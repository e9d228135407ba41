// The paged decode attention kernel for the avx512 variant (flags from CMake by file name).
#define DS_PDA_NS avx512
#include "paged_decode_impl.h"
