// The _C extension module. Each kernel family binds itself in its own file through a
// register_* function declared here, so families evolve without touching each other.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>

#include "ds/build_info.h"
#include "ds/simd.h"
#include "ds/thread_pool.h"

namespace nb = nanobind;

void register_optim(nb::module_& m);
void register_quant(nb::module_& m);
void register_aio(nb::module_& m);
void register_attention(nb::module_& m);
void register_hlinear(nb::module_& m);

NB_MODULE(_C, m) {
  m.def("build_info", &ds::build_info, "Compiler that built the kernels.");
  m.def("build_flags", &ds::build_flags, "Compile flags of the kernel library and ISA variants.");
  m.def("build_arch", &ds::build_arch, "Target architecture of the build.");
  m.def(
      "simd_level", [] { return std::string(ds::simd_level_name(ds::simd_level())); },
      "SIMD variant the kernels use now: 'avx512_bf16', 'avx512', 'avx2', 'neon' or 'scalar'.");
  m.def(
      "detected_simd_level",
      [] { return std::string(ds::simd_level_name(ds::detected_simd_level())); },
      "Best SIMD variant this CPU supports and this build contains.");
  m.def(
      "set_simd_level",
      [](const std::string& name) {
        ds::SimdLevel level;
        if (!ds::parse_simd_level(name.c_str(), &level))
          throw nb::value_error(("unknown SIMD level '" + name +
                                 "'; use one of scalar, neon, avx2, avx512, avx512_bf16")
                                    .c_str());
        return ds::set_simd_level(level);
      },
      nb::arg("level"),
      "Select the SIMD variant (lower than detected, or back to it). Returns False if this CPU or "
      "build cannot run it.");
  m.def(
      "simd_levels_built", [] { return std::string(ds::simd_levels_built()); },
      "SIMD variants compiled into this build.");
  m.def("set_num_threads", &ds::set_num_threads, nb::arg("n"),
        "Size the kernel thread pool (threads including the caller).");
  m.def("get_num_threads", &ds::get_num_threads, "Threads of the kernel pool.");
  register_optim(m);
  register_quant(m);
  register_aio(m);
  register_attention(m);
  register_hlinear(m);
}
