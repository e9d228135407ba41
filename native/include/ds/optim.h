// Fused CPU optimizer steps on flat buffers (Adam/AdamW, Adagrad, Lion).
//
// Every step reads and writes each buffer exactly once, computes in fp32 whatever the storage
// dtype, rounds to nearest-even on store, and spreads the elements of all tensors of one call over
// the kernel thread pool (ds/thread_pool.h) in contiguous ranges. The variant (AVX-512, AVX2 or
// scalar) is picked per call from ds::simd_level().
#pragma once

#include <cstdint>
#include <vector>

namespace ds {
namespace optim {

enum class DType : int { kF32 = 0, kBF16 = 1, kF16 = 2, kNone = 3 };

// Storage dtypes of one call. Supported combinations (see supported()):
//   param f32:       grad f32,             state f32,             lowp none | bf16 | f16
//   param bf16/f16:  grad param or f32,    state f32 or param,    lowp none
struct Types {
  DType param = DType::kF32;
  DType grad = DType::kF32;
  DType state = DType::kF32;
  DType lowp = DType::kNone;
};

// One tensor's buffers. state1/state2 are the optimizer's moments (Adam: exp_avg, exp_avg_sq;
// Adagrad: state_sum, unused; Lion: exp_avg, unused). lowp is an optional low-precision copy of
// the updated params.
struct Buffers {
  void* param = nullptr;
  const void* grad = nullptr;
  void* state1 = nullptr;
  void* state2 = nullptr;
  void* lowp = nullptr;
  int64_t n = 0;
};

struct AdamConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.f;
  bool adamw_mode = true;   // decoupled decay (AdamW); false: L2 term added to the gradient
  float step_size = 1e-3f;  // lr / (1 - beta1^t), or lr without bias correction
  float inv_sqrt_bc2 = 1.f; // 1 / sqrt(1 - beta2^t), or 1 without bias correction
  // Derived coefficients, computed in double by the caller (1 - float(beta) would be off by up
  // to 1e-5 relative for beta2 = 0.999 and bias every second moment).
  float one_minus_beta1 = 0.1f;
  float one_minus_beta2 = 0.001f;
  float decay = 1.f;  // 1 - lr * weight_decay
};

struct AdagradConfig {
  float lr = 1e-2f;  // already decayed for this step
  float eps = 1e-10f;
  float weight_decay = 0.f;
};

struct LionConfig {
  float lr = 1e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.99f;
  float weight_decay = 0.f;
  float one_minus_beta1 = 0.1f;  // computed in double by the caller
  float one_minus_beta2 = 0.01f;
  // lr * weight_decay (double product). The decayed param is formed as p + (-lr*wd*p - lr*sign)
  // with one rounding of p, rather than p * float(1 - lr*wd), whose representation error
  // (up to 6e-8 relative, the same sign every step) would accumulate over many steps.
  float lr_wd = 0.f;
};

bool supported(const Types& t);

// Run one step over every tensor of `tensors` with the process-wide pool. Throws
// std::invalid_argument for an unsupported Types combination.
void adam_step(const AdamConfig& cfg, const Types& t, const std::vector<Buffers>& tensors);
void adagrad_step(const AdagradConfig& cfg, const Types& t, const std::vector<Buffers>& tensors);
void lion_step(const LionConfig& cfg, const Types& t, const std::vector<Buffers>& tensors);

// Memory-bandwidth reference with the access pattern of a fused Adam step: reads a, b, c, d and
// writes a, c, d (4 reads, 3 writes of `elem_bytes`-wide elements), with trivial arithmetic.
void stream_4r3w(void* a, const void* b, void* c, void* d, int64_t n, int elem_bytes);
// The same over the tensors of a list (param = a, grad = b, state1 = c, state2 = d of each
// Buffers), spread over the pool like an optimizer step on that list: the floor of a step on
// the same memory layout.
void stream_4r3w_tensors(const std::vector<Buffers>& tensors, int elem_bytes);

}  // namespace optim
}  // namespace ds
