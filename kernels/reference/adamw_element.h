// Internal: AdamW on one element, the arithmetic every variant performs in
// this order (the CPU SIMD code mirrors it lane by lane; CUDA compiles this
// very function with contraction off).
#ifndef ZSHARD_KERNELS_REFERENCE_ADAMW_ELEMENT_H_
#define ZSHARD_KERNELS_REFERENCE_ADAMW_ELEMENT_H_

#include <math.h>

#include "zshard/kernels/adamw.h"
#include "zshard/kernels/host_device.h"

namespace zshard {
namespace kernels {

// Updates *m and *v and returns the new parameter.
ZS_HOST_DEVICE inline float AdamWElement(float param, float grad, float* m,
                                         float* v, const AdamWConstants& c) {
  const float g = grad * c.grad_scale;
  const float mi = c.beta1 * *m + c.one_minus_beta1 * g;
  const float vi = c.beta2 * *v + (c.one_minus_beta2 * g) * g;
  *m = mi;
  *v = vi;
  const float denom = sqrtf(vi) * c.inv_sqrt_bc2 + c.eps;
  return param * c.decay - (c.step_size * mi) / denom;
}

}  // namespace kernels
}  // namespace zshard

#endif  // ZSHARD_KERNELS_REFERENCE_ADAMW_ELEMENT_H_
