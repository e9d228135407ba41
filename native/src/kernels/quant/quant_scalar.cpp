// Quantization kernels for the baseline ISA (SSE2 on x86-64).
// No FP-exception traps are observed, so float compares may be if-converted and the loops
// vectorised; results are unchanged (IEEE arithmetic, no reassociation, no contraction).
#pragma GCC optimize("no-trapping-math")
#define DS_QUANT_NS scalar
#include "quant_impl.h"
