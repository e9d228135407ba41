// Paged decode attention: checks the block indices and contexts, then splits the (sequence,
// key/value head) pairs over the kernel pool with the SIMD variant in use.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "ds/attention.h"
#include "ds/simd.h"
#include "ds/thread_pool.h"

namespace ds::attention {
namespace scalar {
void paged_decode_items(const PagedDecode& p, int64_t w0, int64_t w1);
}
#if defined(__x86_64__) || defined(__i386__)
namespace avx2 {
void paged_decode_items(const PagedDecode& p, int64_t w0, int64_t w1);
}
namespace avx512 {
void paged_decode_items(const PagedDecode& p, int64_t w0, int64_t w1);
}
#endif

void paged_decode(const PagedDecode& p) {
  if (p.S <= 0) return;
  if (p.KVH <= 0 || p.H % p.KVH != 0 || p.D <= 0 || p.BS <= 0)
    throw std::invalid_argument("paged_decode: heads must be a multiple of kv heads, sizes positive");
  // The cache is read at table[s][t / BS] for t < ctx[s]: every such entry must name a block.
  for (int64_t s = 0; s < p.S; ++s) {
    const int64_t n = p.ctx[s];
    if (n < 1 || n > p.max_blocks * p.BS)
      throw std::invalid_argument("paged_decode: context length " + std::to_string(n) +
                                  " outside [1, " + std::to_string(p.max_blocks * p.BS) + "]");
    for (int64_t b = 0; b < (n + p.BS - 1) / p.BS; ++b) {
      const int32_t blk = p.tables[s * p.max_blocks + b];
      if (blk < 0 || blk >= p.NB)
        throw std::invalid_argument("paged_decode: block " + std::to_string(blk) +
                                    " outside the cache's " + std::to_string(p.NB));
    }
  }
  auto items = scalar::paged_decode_items;
#if defined(__x86_64__) || defined(__i386__)
  const int level = static_cast<int>(ds::simd_level());
  if (level >= static_cast<int>(ds::SimdLevel::kAvx512)) {
    items = avx512::paged_decode_items;
  } else if (level >= static_cast<int>(ds::SimdLevel::kAvx2)) {
    items = avx2::paged_decode_items;
  }
#endif
  ds::parallel_for(p.S * p.KVH, 1, 1, [&](int64_t w0, int64_t w1) { items(p, w0, w1); });
}

}  // namespace ds::attention
