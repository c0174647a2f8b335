// Fused gradient check: in one pass, optionally multiply the gradient by
// `scale` in place (unscaling a loss-scaled gradient), and return the sum of
// squares (accumulated in double) and whether any value is Inf or NaN.
#ifndef ZSHARD_KERNELS_GRAD_CHECK_H_
#define ZSHARD_KERNELS_GRAD_CHECK_H_

#include <cstddef>

#include "absl/status/statusor.h"

namespace zshard {
namespace kernels {

struct GradCheckResult {
  double sum_squares = 0;
  bool non_finite = false;
};

// `grad` is written only when scale != 1. INVALID_ARGUMENT on a null pointer
// with n > 0 or a non-finite scale.
absl::StatusOr<GradCheckResult> ReferenceGradCheck(float* grad, size_t n,
                                                   float scale = 1.0f);

}  // namespace kernels
}  // namespace zshard

#endif  // ZSHARD_KERNELS_GRAD_CHECK_H_
