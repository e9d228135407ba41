#pragma once
#include <string>

namespace ds {
// Compiler that built the kernels.
std::string build_info();
// Flags the kernel library was compiled with (per ISA variant) and the target architecture.
std::string build_flags();
std::string build_arch();
}  // namespace ds
