// Binding of the paged decode attention. A decode step calls it once per layer, so it takes the
// tensors' addresses (checked by ds.ops.attention: fp32 / int32 / int64, CPU, contiguous, the
// shapes given here) rather than arrays, each of which costs microseconds to cross. The kernel
// itself checks the block indices and contexts it reads through. The GIL is released while it
// runs.
#include <nanobind/nanobind.h>

#include <cstdint>

#include "ds/attention.h"

namespace nb = nanobind;

namespace {

template <typename T>
T* at(uintptr_t a) {
  return reinterpret_cast<T*>(a);
}

}  // namespace

void register_attention(nb::module_& m) {
  m.def(
      "paged_decode_attention",
      [](uintptr_t q, uintptr_t k_cache, uintptr_t v_cache, uintptr_t tables, uintptr_t ctx,
         uintptr_t out, int64_t S, int64_t H, int64_t D, int64_t KVH, int64_t NB, int64_t BS,
         int64_t max_blocks, float scale) {
        const ds::attention::PagedDecode p{at<const float>(q),      at<const float>(k_cache),
                                           at<const float>(v_cache), at<const int32_t>(tables),
                                           at<const int64_t>(ctx),  at<float>(out),
                                           S, H, D, KVH, NB, BS, max_blocks, scale};
        nb::gil_scoped_release release;
        ds::attention::paged_decode(p);
      },
      nb::arg("q"), nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("tables"), nb::arg("ctx"),
      nb::arg("out"), nb::arg("S"), nb::arg("H"), nb::arg("D"), nb::arg("KVH"), nb::arg("NB"),
      nb::arg("BS"), nb::arg("max_blocks"), nb::arg("scale"),
      "Paged decode attention on fp32 arrays given by address (see ds.ops.attention).");
}
