// The _C extension module. Each kernel family binds itself in its own file through a
// register_* function declared here, so families can be added without touching each other.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "ds/build_info.h"

namespace nb = nanobind;

NB_MODULE(_C, m) {
  m.def("build_info", &ds::build_info, "Compiler that built the kernels.");
}
