// Accumulate: sum[i] += x[i], and Add: out[i] = a[i] + b[i], one float add
// per element, in every variant the same bits (the fixed-order reduce of
// gradient contributions folds each rank's contribution into the sum with
// them; Add starts the sum from the first two).
#ifndef ZSHARD_KERNELS_ACCUMULATE_H_
#define ZSHARD_KERNELS_ACCUMULATE_H_

#include <cstddef>

#include "absl/status/status.h"

namespace zshard {
namespace kernels {

// `sum` and `x` may be the same buffer but must not overlap otherwise.
// INVALID_ARGUMENT on a null pointer with n > 0.
absl::Status ReferenceAccumulate(float* sum, const float* x, size_t n);

// `out` may be `a` or `b` but must not overlap either otherwise.
// INVALID_ARGUMENT on a null pointer with n > 0.
absl::Status ReferenceAdd(float* out, const float* a, const float* b, size_t n);

}  // namespace kernels
}  // namespace zshard

#endif  // ZSHARD_KERNELS_ACCUMULATE_H_
