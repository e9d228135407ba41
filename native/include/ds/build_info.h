#pragma once
#include <string>

namespace ds {
std::string build_info();
}  // namespace ds
