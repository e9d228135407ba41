#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

namespace ds { std::string build_info(); }

NB_MODULE(_C, m) {
  m.def("build_info", &ds::build_info, "Compiler that built the kernels.");
}
