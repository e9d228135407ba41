// Binding of the fp16 / fp32-weight linear. A decode step calls it once per linear layer, so it
// takes the tensors' addresses (checked by ds.ops.half_linear: dtypes, CPU, contiguous, the shapes
// given here) rather than arrays, each of which costs microseconds to cross. The GIL is released
// while it runs.
#include <nanobind/nanobind.h>

#include <cstdint>
#include <stdexcept>

#include "ds/hlinear.h"

namespace nb = nanobind;

void register_hlinear(nb::module_& m) {
  m.def(
      "linear_few_rows",
      [](uintptr_t x, bool x_half, int64_t m, int64_t k, uintptr_t w, bool w_half, int64_t n,
         uintptr_t bias, bool bias_half, uintptr_t y) {
        if (m < 0 || k < 0 || n < 0) throw std::invalid_argument("linear_few_rows: negative size");
        if (m > 0 && n > 0 && (y == 0 || (k > 0 && (x == 0 || w == 0))))
          throw std::invalid_argument("linear_few_rows needs the addresses of x, w and y");
        nb::gil_scoped_release release;
        ds::hlinear::linear(reinterpret_cast<const void*>(x), x_half, m, k,
                            reinterpret_cast<const void*>(w), w_half, n,
                            reinterpret_cast<const void*>(bias), bias_half,
                            reinterpret_cast<void*>(y));
      },
      nb::arg("x"), nb::arg("x_half"), nb::arg("m"), nb::arg("k"), nb::arg("w"), nb::arg("w_half"),
      nb::arg("n"), nb::arg("bias"), nb::arg("bias_half"), nb::arg("y"),
      "y[m, n] = x[m, k] W[n, k]^T (+ bias) by address: W fp16 (w_half) or fp32, x fp32 or fp16 "
      "(x_half), y in x's type, bias fp32 / fp16 or 0 for none; fp32 sums (see "
      "ds.ops.half_linear).");
}
