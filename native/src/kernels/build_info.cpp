#include "ds/build_info.h"

#include <string>

#ifndef DS_BUILD_FLAGS
#define DS_BUILD_FLAGS "unknown"
#endif
#ifndef DS_BUILD_ARCH
#define DS_BUILD_ARCH "unknown"
#endif

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

std::string build_flags() { return DS_BUILD_FLAGS; }
std::string build_arch() { return DS_BUILD_ARCH; }
}  // namespace ds
