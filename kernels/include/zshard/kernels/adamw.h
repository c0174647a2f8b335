// Fused AdamW over one contiguous fp32 slice (decoupled weight decay, bias
// correction from the step number), as torch.optim.AdamW defines it:
//   p -= lr * wd * p
//   m  = b1 * m + (1 - b1) * g
//   v  = b2 * v + (1 - b2) * g^2
//   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// where g = grad * grad_scale. Raw pointers, no ownership taken; the arrays
// must not overlap. Thread-compatible: callers partition the range.
#ifndef ZSHARD_KERNELS_ADAMW_H_
#define ZSHARD_KERNELS_ADAMW_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace zshard {
namespace kernels {

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
};

// The scalar reference: the definition of correct. INVALID_ARGUMENT on a
// null pointer with n > 0, step < 1, or hyper-parameters out of range.
absl::Status ReferenceAdamW(float* param, const float* grad, float* m,
                            float* v, size_t n, const AdamWStep& hp);

}  // namespace kernels
}  // namespace zshard

#endif  // ZSHARD_KERNELS_ADAMW_H_
