// Bindings of the optim kernel family (filled in by that family's implementation).
#include <nanobind/nanobind.h>

namespace nb = nanobind;

void register_optim(nb::module_& m) { (void)m; }
