// Fused AdamW over one contiguous fp32 slice (decoupled weight decay, bias
// correction from the step number), as torch.optim.AdamW defines it:
//   p -= lr * wd * p
//   m  = b1 * m + (1 - b1) * g
//   v  = b2 * v + (1 - b2) * g^2
//   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// where g = grad * grad_scale. Optionally writes a bf16 or fp16 copy of the
// updated parameters in the same pass. Raw pointers, no ownership taken; the
// arrays must not overlap. Thread-compatible: callers partition the range.
#ifndef ZSHARD_KERNELS_ADAMW_H_
#define ZSHARD_KERNELS_ADAMW_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace zshard {
namespace kernels {

// 16-bit float formats written by the kernels.
enum class HalfType { kNone, kBf16, kFp16 };

struct AdamWStep {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
  // 1-based number of this update (bias correction uses it).
  int64_t step = 1;
  // Multiplies every gradient on the fly (1 / loss scale, 1 / contributions).
  float grad_scale = 1.0f;
  // Format of the copy written to `half_out` (kNone: no copy).
  HalfType half_type = HalfType::kNone;
};

// Per-call constants every implementation uses, computed once from the step
// so that all variants do the same arithmetic.
struct AdamWConstants {
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float eps, step_size, inv_sqrt_bc2, decay, grad_scale;
};

// INVALID_ARGUMENT on step < 1 or a hyper-parameter out of range.
absl::Status MakeAdamWConstants(const AdamWStep& hp, AdamWConstants* out);

// The scalar reference: the definition of correct. INVALID_ARGUMENT on a null
// pointer with n > 0 (half_out too, when a copy is asked for) or bad
// hyper-parameters. The CPU SIMD variants (CpuKernels) give the same bits.
absl::Status ReferenceAdamW(float* param, const float* grad, float* m,
                            float* v, size_t n, const AdamWStep& hp,
                            void* half_out = nullptr);

}  // namespace kernels
}  // namespace zshard

#endif  // ZSHARD_KERNELS_ADAMW_H_
