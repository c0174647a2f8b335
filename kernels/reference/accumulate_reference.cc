#include "reference/scalar_kernels.h"
#include "zshard/kernels/accumulate.h"

namespace zshard {
namespace kernels {
namespace scalar {

void Accumulate(float* sum, const float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) sum[i] += x[i];
}

}  // namespace scalar

absl::Status ReferenceAccumulate(float* sum, const float* x, size_t n) {
  if (n > 0 && (!sum || !x)) {
    return absl::InvalidArgumentError("accumulate: null buffer");
  }
  scalar::Accumulate(sum, x, n);
  return absl::OkStatus();
}

}  // namespace kernels
}  // namespace zshard
