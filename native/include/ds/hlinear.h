// Linear layer with an fp16 or fp32 weight for a few rows of activations (a decode step): the
// weight is read once in its stored form (fp16 converted in registers) and multiplied in fp32.
#pragma once

#include <cstdint>

namespace ds::hlinear {

// y[m, n] = x[m, k] W[n, k]^T (+ bias[n]), W row-major fp16 (IEEE binary16 bits) when w_half,
// else fp32. x is fp32, or
// fp16 when x_half; y has x's type; bias (may be null) is fp32, or fp16 when bias_half. Sums run
// in fp32 and y is rounded once (to nearest even) at the end. Rows of W are split over the kernel
// pool (ds::parallel_for); any m, k, n >= 0.
void linear(const void* x, bool x_half, int64_t m, int64_t k, const void* w, bool w_half,
            int64_t n, const void* bias, bool bias_half, void* y);

}  // namespace ds::hlinear
