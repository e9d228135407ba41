// The _C extension module. Each kernel family binds itself in its own file through a
// register_* function declared here, so families evolve without touching each other.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "ds/build_info.h"

namespace nb = nanobind;

void register_optim(nb::module_& m);
void register_quant(nb::module_& m);
void register_aio(nb::module_& m);

NB_MODULE(_C, m) {
  m.def("build_info", &ds::build_info, "Compiler that built the kernels.");
  register_optim(m);
  register_quant(m);
  register_aio(m);
}
