// Splits the groups of a quantization call into contiguous ranges on the shared kernel pool.
// Groups are independent, so any split gives the same bytes; ranges of at least ~64 KiB of input
// keep the dispatch overhead negligible.
#pragma once

#include <algorithm>
#include <cstdint>

#include "ds/thread_pool.h"

namespace ds::quant {

template <class F>
void for_group_ranges(int64_t num_groups, int64_t group_size, F&& fn) {
  if (num_groups <= 0) return;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(1, group_size));
  ds::parallel_for(num_groups, grain, 1, [&](int64_t g0, int64_t g1) { fn(g0, g1); });
}

}  // namespace ds::quant
