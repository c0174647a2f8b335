#include "reference/scalar_kernels.h"
#include "zshard/kernels/accumulate.h"

namespace zshard {
namespace kernels {
namespace scalar {

void Add(float* out, const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace scalar

absl::Status ReferenceAccumulate(float* sum, const float* x, size_t n) {
  if (n > 0 && (!sum || !x)) {
    return absl::InvalidArgumentError("accumulate: null buffer");
  }
  scalar::Add(sum, sum, x, n);
  return absl::OkStatus();
}

absl::Status ReferenceAdd(float* out, const float* a, const float* b,
                          size_t n) {
  if (n > 0 && (!out || !a || !b)) {
    return absl::InvalidArgumentError("add: null buffer");
  }
  scalar::Add(out, a, b, n);
  return absl::OkStatus();
}

}  // namespace kernels
}  // namespace zshard
