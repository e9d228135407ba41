// Run-time dispatch and multi-threading of the optimizer kernels.
#include "ds/optim.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "ds/simd.h"
#include "ds/thread_pool.h"
#include "variants.h"

namespace ds {
namespace optim {
namespace {

// Below this many elements per thread, waking another thread costs more than it saves.
constexpr int64_t kGrain = 1 << 15;
// Thread ranges start on 64-element boundaries: whole cache lines for every dtype, whole vectors.
constexpr int64_t kAlign = 64;

// Spread the concatenated elements of all tensors over the pool in contiguous ranges, so a list
// of many small tensors parallelises as well as one flat buffer and costs one pool dispatch.
template <class Fn>
void run_tensors(const std::vector<Buffers>& tensors, Fn&& range_fn) {
  std::vector<int64_t> start(tensors.size() + 1, 0);
  for (size_t i = 0; i < tensors.size(); ++i) start[i + 1] = start[i] + tensors[i].n;
  const int64_t total = start.back();
  if (total == 0) return;
  auto body = [&](int64_t lo, int64_t hi) {
    size_t t = static_cast<size_t>(std::upper_bound(start.begin(), start.end(), lo) -
                                   start.begin()) - 1;
    for (; t < tensors.size() && start[t] < hi; ++t) {
      const int64_t b = std::max(lo, start[t]) - start[t];
      const int64_t e = std::min(hi, start[t + 1]) - start[t];
      if (e > b) range_fn(tensors[t], b, e);
    }
  };
  ds::parallel_for(total, kGrain, kAlign, body);
}

void check(const Types& t) {
  if (!supported(t))
    throw std::invalid_argument(
        "unsupported dtype combination: fp32 params need fp32 grads and fp32 state (low-precision "
        "copy bf16/fp16 or none); bf16/fp16 params need grads and state of the param dtype or "
        "fp32 and no low-precision copy");
}

}  // namespace

bool supported(const Types& t) {
  if (t.param == DType::kF32)
    return t.grad == DType::kF32 && t.state == DType::kF32;
  if (t.param == DType::kBF16 || t.param == DType::kF16) {
    auto ok = [&](DType d) { return d == DType::kF32 || d == t.param; };
    return ok(t.grad) && ok(t.state) && t.lowp == DType::kNone;
  }
  return false;
}

#if defined(__x86_64__) || defined(__i386__)
#define DS_DISPATCH(fn, ...)                                                    \
  switch (ds::simd_level()) {                                                   \
    case SimdLevel::kAvx512Bf16: avx512bf16::fn(__VA_ARGS__); break;            \
    case SimdLevel::kAvx512: avx512::fn(__VA_ARGS__); break;                    \
    case SimdLevel::kAvx2: avx2::fn(__VA_ARGS__); break;                        \
    default: scalar::fn(__VA_ARGS__); break;                                    \
  }
#elif defined(__aarch64__) && defined(DS_HAVE_NEON)
#define DS_DISPATCH(fn, ...)                                                    \
  if (ds::simd_level() == SimdLevel::kNeon) neon::fn(__VA_ARGS__);              \
  else scalar::fn(__VA_ARGS__);
#else
#define DS_DISPATCH(fn, ...) scalar::fn(__VA_ARGS__);
#endif

void adam_step(const AdamConfig& cfg, const Types& t, const std::vector<Buffers>& tensors) {
  check(t);
  run_tensors(tensors, [&](const Buffers& b, int64_t s, int64_t e) {
    DS_DISPATCH(adam_range, cfg, t, b, s, e)
  });
}

void adagrad_step(const AdagradConfig& cfg, const Types& t, const std::vector<Buffers>& tensors) {
  check(t);
  run_tensors(tensors, [&](const Buffers& b, int64_t s, int64_t e) {
    DS_DISPATCH(adagrad_range, cfg, t, b, s, e)
  });
}

void lion_step(const LionConfig& cfg, const Types& t, const std::vector<Buffers>& tensors) {
  check(t);
  run_tensors(tensors, [&](const Buffers& b, int64_t s, int64_t e) {
    DS_DISPATCH(lion_range, cfg, t, b, s, e)
  });
}

void stream_4r3w(void* a, const void* b, void* c, void* d, int64_t n, int elem_bytes) {
  if (elem_bytes != 2 && elem_bytes != 4)
    throw std::invalid_argument("stream_4r3w: elements must be 2 or 4 bytes wide");
  ds::parallel_for(n, kGrain, kAlign, [&](int64_t s, int64_t e) {
    DS_DISPATCH(stream_range, a, b, c, d, s, e, elem_bytes)
  });
}

void stream_4r3w_tensors(const std::vector<Buffers>& tensors, int elem_bytes) {
  if (elem_bytes != 2 && elem_bytes != 4)
    throw std::invalid_argument("stream_4r3w: elements must be 2 or 4 bytes wide");
  run_tensors(tensors, [&](const Buffers& b, int64_t s, int64_t e) {
    DS_DISPATCH(stream_range, b.param, b.grad, b.state1, b.state2, s, e, elem_bytes)
  });
}

}  // namespace optim
}  // namespace ds
