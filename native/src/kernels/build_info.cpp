#include "ds/build_info.h"

#include <string>

namespace ds {
std::string build_info() {
#if defined(__clang__)
  return std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  return std::string("gcc ") + __VERSION__;
#else
  return "unknown compiler";
#endif
}
}  // namespace ds
