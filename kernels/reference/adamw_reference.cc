#include <cmath>

#include "absl/strings/str_cat.h"
#include "zshard/kernels/adamw.h"

namespace zshard {
namespace kernels {

absl::Status ReferenceAdamW(float* param, const float* grad, float* m,
                            float* v, size_t n, const AdamWStep& hp) {
  if (n > 0 && (!param || !grad || !m || !v)) {
    return absl::InvalidArgumentError("AdamW: null buffer");
  }
  if (hp.step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdamW: step must be >= 1, got ", hp.step));
  }
  if (!(hp.lr >= 0) || !(hp.beta1 >= 0 && hp.beta1 < 1) ||
      !(hp.beta2 >= 0 && hp.beta2 < 1) || !(hp.eps > 0) ||
      !(hp.weight_decay >= 0)) {
    return absl::InvalidArgumentError("AdamW: hyper-parameter out of range");
  }
  const double bc1 = 1.0 - std::pow(static_cast<double>(hp.beta1), hp.step);
  const double bc2 = 1.0 - std::pow(static_cast<double>(hp.beta2), hp.step);
  const float step_size = static_cast<float>(hp.lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float decay = 1.0f - hp.lr * hp.weight_decay;
  const float b1 = hp.beta1, b2 = hp.beta2;
  for (size_t i = 0; i < n; ++i) {
    const float g = grad[i] * hp.grad_scale;
    const float mi = b1 * m[i] + (1.0f - b1) * g;
    const float vi = b2 * v[i] + (1.0f - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) * inv_sqrt_bc2 + hp.eps;
    param[i] = param[i] * decay - step_size * mi / denom;
  }
  return absl::OkStatus();
}

}  // namespace kernels
}  // namespace zshard
