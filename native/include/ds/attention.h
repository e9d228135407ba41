// Paged attention for decode steps on CPU: one query token per sequence against that sequence's
// cached keys and values, read in place from the blocked cache through its block table (no
// gathered copy). fp32 throughout; the caller checks shapes, dtypes and contiguity.
#pragma once

#include <cstdint>

namespace ds::attention {

struct PagedDecode {
  const float* q;        // [S, H, D]
  const float* k_cache;  // [KVH, NB, BS, D]
  const float* v_cache;  // [KVH, NB, BS, D]
  const int32_t* tables; // [S, max_blocks]
  const int64_t* ctx;    // [S] keys each sequence attends to (the cache's first ctx[s] positions)
  float* out;            // [S, H, D]
  int64_t S, H, D, KVH, NB, BS, max_blocks;
  float scale;
};

// out = softmax(scale * q k^T) v per sequence and head, heads grouped onto KVH key/value heads
// (H / KVH query heads each). Throws std::invalid_argument when a context or block index falls
// outside the cache.
void paged_decode(const PagedDecode& p);

}  // namespace ds::attention
