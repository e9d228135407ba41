// Quantization kernels for the AVX-512 (16 lanes), compiled with that ISA's flags only for this file.
// No FP-exception traps are observed, so float compares may be if-converted and the loops
// vectorised; results are unchanged (IEEE arithmetic, no reassociation, no contraction).
#pragma GCC optimize("no-trapping-math")
// GCC 12 reports its own intrinsics' undefined-register idiom (__m512 __Y = __Y) as possibly
// uninitialised once they are inlined under the pragma above; the idiom is intended.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define DS_QUANT_NS avx512
#include "quant_impl.h"
