#include <cmath>

#include "reference/scalar_kernels.h"
#include "zshard/kernels/grad_check.h"

namespace zshard {
namespace kernels {
namespace scalar {

void GradCheck(float* g, size_t n, float scale, double* sum, bool* non_finite) {
  double s = 0;
  bool bad = false;
  const bool write = scale != 1.0f;
  for (size_t i = 0; i < n; ++i) {
    const float x = write ? g[i] * scale : g[i];
    if (write) g[i] = x;
    bad |= !std::isfinite(x);
    s += static_cast<double>(x) * static_cast<double>(x);
  }
  *sum += s;
  *non_finite |= bad;
}

}  // namespace scalar

absl::StatusOr<GradCheckResult> ReferenceGradCheck(float* grad, size_t n,
                                                   float scale) {
  if (n > 0 && !grad) {
    return absl::InvalidArgumentError("gradient check: null buffer");
  }
  if (!std::isfinite(scale)) {
    return absl::InvalidArgumentError("gradient check: non-finite scale");
  }
  GradCheckResult r;
  scalar::GradCheck(grad, n, scale, &r.sum_squares, &r.non_finite);
  return r;
}

}  // namespace kernels
}  // namespace zshard
